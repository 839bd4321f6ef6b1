"""How the episode runner and the environment pool build an environment for a task (imports only ``types``)."""

from __future__ import annotations

from environments import TextEnv, make_env
from verl_gigpo.rollout.types import EpisodeConfig, TaskSpec

__all__ = ["make_task_env"]


def make_task_env(task: TaskSpec, config: EpisodeConfig) -> TextEnv:
    """Build ``task``'s environment with the episode's ``max_steps``, ``key_mode`` and ``parse`` rules.

    Raises ValueError when ``task.env_kwargs`` repeats ``max_steps`` or ``key_mode``, or the registry refuses it.
    """
    clash = {"max_steps", "key_mode"} & set(task.env_kwargs)
    if clash:
        raise ValueError(
            f"env_kwargs of task {task} repeat {sorted(clash)}; set them in the episode config (env.max_steps, "
            "algorithm.gigpo.key_mode) instead"
        )
    env = make_env(task.env_name, max_steps=config.max_steps, key_mode=config.key_mode, **dict(task.env_kwargs))
    env.parse_style = config.parse
    return env
