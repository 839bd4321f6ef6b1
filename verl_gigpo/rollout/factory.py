"""How the episode runner and the environment pool build an environment for a task.

The bottom of :mod:`verl_gigpo.rollout` with :mod:`verl_gigpo.rollout.types`: :mod:`~verl_gigpo.rollout.execution.pool`
and :mod:`~verl_gigpo.rollout.episode` both import it, and it imports neither, so the package's imports go one way
(``types`` <- ``factory`` <- ``pool`` <- ``episode``).
"""

from __future__ import annotations

from environments import TextEnv, make_env
from verl_gigpo.rollout.types import EpisodeConfig, TaskSpec

__all__ = ["make_task_env"]


def make_task_env(task: TaskSpec, config: EpisodeConfig) -> TextEnv:
    """Build the environment of ``task`` with the episode's ``max_steps`` and ``key_mode``, and its reply-parsing rules
    (``config.parse``, :attr:`environments.base.TextEnv.parse_style`).

    Raises:
        ValueError: ``task.env_kwargs`` repeats ``max_steps`` or ``key_mode`` (they belong to the episode config),
            or the registry rejects the name or a constructor argument.
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
