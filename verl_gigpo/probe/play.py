"""Playing the probe's episodes, and reading every key mode's anchor keys from their states.

:func:`play_random` draws the environment's own valid actions (episode ``k`` of task ``g`` from
``np.random.default_rng([seed, g, k])``) through the engines' episode runner; :func:`play_model` plays a model on
the local engine, then :func:`replay_keys` reads every mode's keys in a replay. Tasks are seeds ``0 .. groups - 1``,
group ids ``task<g>``. docs/probe.md ("What it plays", "Key modes, read once").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from environments import EnvError, TextEnv, make_env
from verl_gigpo.rollout.episode import run_episode
from verl_gigpo.rollout.execution.pool import EnvPool
from verl_gigpo.rollout.execution.threads import EnvThreadPool
from verl_gigpo.rollout.factory import make_task_env
from verl_gigpo.rollout.step_rows import StepBatch
from verl_gigpo.rollout.types import Episode, EpisodeConfig, TaskSpec

__all__ = [
    "PROBE_STREAM",
    "PlayedEpisodes",
    "ProbeError",
    "RandomActions",
    "play_model",
    "play_random",
    "replay_keys",
]

logger = logging.getLogger(__name__)

#: the request-seed stream of the probe's model episodes (validation and training have their own)
PROBE_STREAM = "probe"


class ProbeError(RuntimeError):
    """The probe cannot go on: an environment that offers no action, or a replay that does not meet the episode."""


@dataclass
class PlayedEpisodes:
    """The probe's episodes (``groups * n``, (task, member) order), their step rows ``steps`` (N rows), and ``keys``:
    ``{env key mode: (N,) str}`` per row (``""`` for rows of failed episodes)."""

    episodes: list[Episode]
    keys: dict[str, np.ndarray]
    steps: StepBatch
    policy: str
    max_steps: int

    def __post_init__(self) -> None:
        for mode, column in self.keys.items():
            if len(column) != len(self.steps):
                raise ValueError(f"keys[{mode!r}] has {len(column)} rows, the episodes {len(self.steps)}")


def probe_tasks(env_name: str, groups: int, split: str, env_kwargs: Mapping[str, Any]) -> list[TaskSpec]:
    """The probe's tasks: seeds ``0 .. groups - 1`` of ``split`` (``env_kwargs`` without ``max_steps``)."""
    return [TaskSpec(env_name, g, split, dict(env_kwargs)) for g in range(groups)]


def split_max_steps(env_kwargs: Mapping[str, Any]) -> tuple[int | None, dict[str, Any]]:
    """``(max_steps or None, the other kwargs)``; ValueError for a ``key_mode`` among them (``--keys`` chooses)."""
    kwargs = dict(env_kwargs)
    if "key_mode" in kwargs:
        raise ValueError(
            "key_mode=...: the probe reads every key mode from the same episodes; choose them with --keys "
            "(e.g. --keys state,history:1,similarity:0.9)"
        )
    return kwargs.pop("max_steps", None), kwargs


def build_env(env_name: str, kwargs: Mapping[str, Any], max_steps: int | None) -> TextEnv:
    """The environment ``env_name`` built with ``kwargs`` (and ``max_steps`` when given).

    Raises:
        ValueError: an unknown environment, or a constructor argument it refuses.
        ImportError: its optional dependency is missing.
    """
    limit = {"max_steps": max_steps} if max_steps is not None else {}
    try:
        return make_env(env_name, key_mode="state", **limit, **kwargs)
    except (TypeError, ValueError) as exc:
        given = " ".join(f"{k}={v!r}" for k, v in {**kwargs, **limit}.items()) or "no arguments"
        raise ValueError(f"{env_name} with {given}: {exc}") from exc


def checked_split(env: TextEnv, split: str | None) -> str:
    """``split``, or the environment's first split when None; ValueError naming ``--split`` and the known ones."""
    if split is None:
        return env.splits[0]
    if split not in env.splits:
        raise ValueError(f"--split {split!r}: {env.name} has the splits {', '.join(env.splits)}")
    return split


def play_random(
    env_name: str,
    *,
    groups: int,
    n: int,
    modes: Sequence[str],
    split: str | None = None,
    seed: int = 0,
    env_kwargs: Mapping[str, Any] | None = None,
    progress: bool = False,
) -> PlayedEpisodes:
    """Play ``groups`` tasks ``n`` times each with uniformly drawn valid actions, reading every key mode of ``modes``.

    ``env_kwargs``: constructor arguments (``max_steps`` sets the step limit); ``seed`` seeds the action draws.

    Raises:
        ValueError: an unknown environment, split or constructor argument.
        ProbeError: the environment offers no action in some state.
        EnvError: the environment failed (it names the task and the step).
    """
    max_steps, kwargs = split_max_steps(env_kwargs or {})
    policy = RandomActions(env_name, kwargs, max_steps, modes)
    split = checked_split(policy.env, split)
    tasks = probe_tasks(env_name, groups, split, kwargs)
    # the runner's rule and penalty; no history and unbounded lengths: the prompt is rendered, never sent, and the
    # reply is the whole action
    limits = {"history_length": 0, "max_prompt_length": 10**9, "max_response_length": 10**9}
    config = EpisodeConfig(max_steps=policy.env.max_steps, **limits)
    keys: dict[str, list[str]] = {mode: [] for mode in modes}
    episodes: list[Episode] = []
    bar = _bar(len(tasks) * n, f"{env_name} episodes (random valid actions)", progress)
    pool, threads = EnvPool(policy.factory, max_idle=1), EnvThreadPool(0)  # one environment, calls inline
    pool.release(tasks[0], config, policy.env)  # the one built first serves every episode (unless one breaks it)
    try:
        for g, task in enumerate(tasks):
            for k in range(n):
                policy.start(np.random.default_rng([seed, g, k]))
                episode = asyncio.run(
                    run_episode(
                        task,
                        generator=policy,
                        encoder=_no_tokens,
                        tokenizer=policy,
                        config=config,
                        traj_id=f"random-{g}-{k}",
                        sampling_params={},
                        executor=threads,
                        env_pool=pool,
                        group_id=f"task{g}",
                    )
                )
                if episode.env_error is not None:  # the runner recorded it; the probe stops, naming it
                    where = f"task seed {task.seed}, episode {episode.traj_id}"
                    raise EnvError(env_name, episode.task_id, len(episode.steps), f"{where}: {episode.env_error}")
                rows = policy.rows(episode)
                for mode, column in keys.items():
                    column.extend(rows[mode])
                episodes.append(episode)
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
        pool.close()
        threads.shutdown()
    invalid = sum(ep.num_invalid for ep in episodes)
    if invalid:
        logger.warning("%d random example actions were not valid actions (penalised as the runner does)", invalid)
    policy_text = f"random valid actions (seed {seed})"
    return _played(episodes, keys, policy_text, config.max_steps)


class RandomActions:
    """The random policy as ``run_episode``'s generator and tokenizer: each request draws an example action (reply:
    its UTF-8 bytes) and reads every mode's key first."""

    def __init__(self, env_name: str, kwargs: Mapping[str, Any], max_steps: int | None, modes: Sequence[str]):
        self.build = lambda: build_env(env_name, kwargs, max_steps)
        self.env = self.build()
        self.modes = list(modes)
        self.rng = np.random.default_rng(0)
        self.keys: dict[str, list[str]] = {}

    def factory(self, task: TaskSpec, config: EpisodeConfig) -> TextEnv:
        """The pool's factory, called when a failed episode closed the environment: a new one, the one drawn from."""
        self.env = self.build()
        return self.env

    def start(self, rng: np.random.Generator) -> None:
        """A new episode: its action draws from ``rng``, its keys from none yet."""
        self.rng, self.keys = rng, {mode: [] for mode in self.modes}

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any]) -> Any:
        """One uniformly drawn example action, as its UTF-8 bytes; ProbeError when the state offers none."""
        choices = self.env.example_actions()
        if not choices:
            raise ProbeError(
                f"{self.env.name} episode {request_id} reached a state with no action (example_actions() is "
                "empty), so the random policy cannot play it; probe it with --model"
            )
        action = choices[int(self.rng.integers(len(choices)))]
        for mode, column in self.keys.items():
            column.append(self.env.anchor_key(mode))
        return SimpleNamespace(token_ids=list(action.encode()), log_probs=None)

    @staticmethod
    def decode(token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The action text of :meth:`generate`'s reply."""
        return bytes(token_ids).decode()

    def rows(self, episode: Episode) -> dict[str, list[str]]:
        """Every mode's keys of ``episode``'s step rows (one per step)."""
        for mode, column in self.keys.items():
            if len(column) != len(episode.steps):
                raise ProbeError(f"episode {episode.traj_id}: {len(column)} {mode} keys for {len(episode.steps)} steps")
        return self.keys


def _no_tokens(prompt_text: str) -> list[int]:
    return []


def play_model(
    model: str | Path,
    env_name: str,
    *,
    groups: int,
    n: int,
    modes: Sequence[str],
    split: str | None = None,
    seed: int = 0,
    env_kwargs: Mapping[str, Any] | None = None,
    overrides: Sequence[str] = (),
    registry: Mapping[str, str] | None = None,
    device: str | None = None,
    progress: bool = False,
) -> PlayedEpisodes:
    """Play ``groups`` tasks ``n`` times each with the model folder ``model`` on the local engine, then
    :func:`replay_keys`. Other arguments as :func:`play_random`; ``overrides``: local-engine ``key=value`` items.

    Raises:
        ValueError: a bad override or setting (naming the key); an unknown environment or split.
        ProbeError: a replay that does not meet its episode.
    """
    from omegaconf import OmegaConf

    from verl_gigpo.local.config import load_config
    from verl_gigpo.local.rollout import LocalRollout

    max_steps, kwargs = split_max_steps(env_kwargs or {})
    with contextlib.closing(build_env(env_name, kwargs, max_steps)) as probe_env:  # the limit (its own default)
        limit, split = probe_env.max_steps, checked_split(probe_env, split)
    env_layer: dict[str, Any] = {"name": env_name, "kwargs": kwargs, "max_steps": limit}
    if registry:
        env_layer["registry"] = dict(registry)
    layer = {
        "actor_rollout_ref": {"model": {"path": str(model)}, "rollout": {"n": n}},
        "env": env_layer,
        "trainer": {"seed": seed, **({"device": device} if device is not None else {})},
        "local": {"progress": False, "plot": False},
    }
    cfg = load_config(overrides, layers=[layer])
    tasks = probe_tasks(env_name, groups, split, OmegaConf.to_container(cfg.env.kwargs, resolve=True))
    rollout = LocalRollout(cfg)
    try:
        episodes = rollout.play(tasks, n, validation=False, stream=PROBE_STREAM, progress=progress)
        config = rollout.episode_config
    finally:
        rollout.close()
    failed = sum(ep.env_error is not None for ep in episodes)
    if failed:
        logger.warning("%d of %d episodes failed in the environment; their rows are left out", failed, len(episodes))
    keys = replay_keys(episodes, modes, config, progress=progress)
    temperature = cfg.actor_rollout_ref.rollout.temperature
    policy = f"model {model} (sampled at temperature {temperature}, seed {cfg.trainer.seed})"
    return _played(episodes, keys, policy, config.max_steps)


def replay_keys(
    episodes: Sequence[Episode], modes: Sequence[str], config: EpisodeConfig, *, progress: bool = False
) -> dict[str, list[str]]:
    """``{mode: N keys}`` of ``episodes``' step rows (row order of :meth:`StepBatch.from_episodes`, ``""`` for failed
    ones), each episode's commands replayed in a fresh reset of its task.

    Raises:
        ProbeError: a replayed step's key or reward differs from the record (the environment is not deterministic).
    """
    keys: dict[str, list[str]] = {mode: [] for mode in modes}
    played = [ep for ep in episodes if ep.env_error is None and ep.steps]
    if not played:
        for ep in episodes:
            for column in keys.values():
                column.extend([""] * max(1, len(ep.steps)))
        return keys
    env = make_task_env(played[0].task, config)
    bar = _bar(len(episodes), "replaying for the keys", progress)
    try:
        for ep in episodes:
            if ep.env_error is not None or not ep.steps:
                for column in keys.values():
                    column.extend([""] * max(1, len(ep.steps)))
            else:
                _replay(env, ep, keys, config.key_mode)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
        env.close()
    return keys


def _replay(env: TextEnv, episode: Episode, keys: dict[str, list[str]], key_mode: str) -> None:
    task = episode.task
    env.reset(seed=task.seed, options={"split": task.split})
    for step in episode.steps:
        where = f"replaying episode {episode.traj_id} ({task.env_name} task {task.seed}) at step {step.step_id}"
        if env.anchor_key(key_mode) != step.anchor_key:
            raise ProbeError(
                f"{where}: the {key_mode} key differs from the one recorded while playing; the environment is not "
                "deterministic given the task seed and the commands (python -m environments.checker checks it)"
            )
        for mode, column in keys.items():
            column.append(env.anchor_key(mode))
        _, reward, _, _, _ = env.step(step.action)
        if float(reward) != step.env_reward:
            raise ProbeError(f"{where}: reward {reward} where the episode got {step.env_reward}")


def _played(episodes: list[Episode], keys: dict[str, list[str]], policy: str, max_steps: int) -> PlayedEpisodes:
    columns = {mode: np.asarray(column, dtype=object) for mode, column in keys.items()}
    return PlayedEpisodes(episodes, columns, StepBatch.from_episodes(episodes), policy, int(max_steps))


def _bar(total: int, desc: str, progress: bool) -> Any:
    if not progress:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="ep")
