"""Episode metrics (``env/*``, ``episode/*``, and the local engine's ``val/*``): one definition for both engines.

Each engine reduces its rollouts to one :class:`TrajectorySummary` per trajectory and calls
:func:`episode_metrics`, so a metric name means the same thing whichever engine logged it. Trajectories whose
environment failed are left out of every policy metric. Every metric and what it counts over: docs/metrics.md.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from verl_gigpo.rollout.types import Episode

__all__ = [
    "MAX_TYPE_KEYS",
    "TrajectorySummary",
    "episode_metrics",
    "run_names",
    "summaries_from_episodes",
    "type_metrics",
    "val_names",
    "validation_type",
]

#: most task types one validation logs keys for (the rarest pooled under ``other``)
MAX_TYPE_KEYS = 12

_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class TrajectorySummary:
    """What the episode metrics need of one trajectory, whichever engine played it. ``batch_rows``: its rows in the
    training batch (failed episodes' masked rows included; one placeholder when reset failed)."""

    won: bool
    length: int
    episode_return: float
    num_invalid: int = 0
    history_dropped_steps: int = 0
    observation_truncated_steps: int = 0
    env_error: bool = False
    task_type: str | None = None
    env_seconds: float = 0.0
    generate_seconds: float = 0.0
    batch_rows: int = 0
    abandoned_threads: int = 0

    @classmethod
    def from_episode(cls, episode: Episode) -> TrajectorySummary:
        """The summary of a finished :class:`~verl_gigpo.rollout.types.Episode` (the local engine's rollouts)."""
        failed = episode.env_error is not None
        return cls(
            won=bool(episode.won),
            length=episode.length,
            episode_return=float(episode.episode_return),
            num_invalid=episode.num_invalid,
            history_dropped_steps=sum(step.history_dropped > 0 for step in episode.steps),
            observation_truncated_steps=episode.num_observation_truncated,
            env_error=failed,
            task_type=episode.task_type,
            env_seconds=float(episode.timing.get("env", 0.0)),
            generate_seconds=float(episode.timing.get("generate", 0.0)),
            batch_rows=max(episode.length, 1) if failed else episode.length,
            abandoned_threads=episode.abandoned_threads,
        )


def summaries_from_episodes(episodes: Iterable[Episode]) -> list[TrajectorySummary]:
    """One :class:`TrajectorySummary` per episode (:meth:`TrajectorySummary.from_episode`), in order."""
    return [TrajectorySummary.from_episode(episode) for episode in episodes]


def episode_metrics(
    trajectories: Sequence[TrajectorySummary], *, prefix: str = "env", episode_prefix: str = "episode"
) -> dict[str, float]:
    """The ``env/*`` and ``episode/*`` metrics (docs/metrics.md) of a batch's trajectories; empty without any.

    ``prefix`` and ``episode_prefix`` rename the two namespaces (the local engine's validation: ``val``).
    """
    if not trajectories:
        return {}
    done = [t for t in trajectories if not t.env_error]  # C: the environment did not fail
    steps = sum(t.length for t in done)
    returns = np.array([t.episode_return for t in done], dtype=np.float64)  # (|C|,)

    def mean(values: list[float]) -> float:
        return float(np.mean(values)) if values else 0.0

    out = {
        f"{prefix}/success_rate": mean([float(t.won) for t in done]),
        f"{prefix}/episode_length": mean([float(t.length) for t in done]),
        f"{prefix}/invalid_action_rate": sum(t.num_invalid for t in done) / steps if steps else 0.0,
        f"{prefix}/history_dropped_rate": sum(t.history_dropped_steps for t in done) / steps if steps else 0.0,
        f"{prefix}/observation_truncated_rate": (
            sum(t.observation_truncated_steps for t in done) / steps if steps else 0.0
        ),
        f"{prefix}/env_error_rate": 1.0 - len(done) / len(trajectories),
        f"{prefix}/abandoned_threads": float(sum(t.abandoned_threads for t in trajectories)),
        f"{episode_prefix}/return_mean": float(returns.mean()) if done else 0.0,
        f"{episode_prefix}/return_std": float(returns.std()) if done else 0.0,
        f"{episode_prefix}/return_min": float(returns.min()) if done else 0.0,
        f"{episode_prefix}/return_max": float(returns.max()) if done else 0.0,
        f"{episode_prefix}/num_trajectories": float(len(trajectories)),
        f"{episode_prefix}/num_step_rows": float(sum(t.batch_rows for t in trajectories)),
        f"{episode_prefix}/env_seconds_mean": mean([t.env_seconds for t in trajectories]),
        f"{episode_prefix}/generate_seconds_mean": mean([t.generate_seconds for t in trajectories]),
    }
    by_type: dict[str, list[float]] = defaultdict(list)
    for t in done:
        if t.task_type:
            by_type[str(t.task_type)].append(float(t.won))
    for task_type, won in sorted(by_type.items()):
        out[f"{prefix}/success_rate/{task_type}"] = mean(won)
    return out


def validation_type(task_type: str | None) -> str:
    """The validation group of a task type: its part before the first ``/``, cleaned for a metric name (``all``
    for none)."""
    head = _NAME_UNSAFE.sub("_", str(task_type).split("/", 1)[0]).strip("_") if task_type else ""
    return head or "all"


def type_metrics(
    data_source: str, trajectories: Sequence[TrajectorySummary], *, max_types: int = MAX_TYPE_KEYS
) -> dict[str, float]:
    """``val-core/<data_source>/<type>/{success,length,invalid_per_step,count}`` (docs/metrics.md) by
    :func:`validation_type`; at most ``max_types`` (>= 2) types, the rarest pooled as ``other``."""
    if max_types < 2:
        raise ValueError(f"max_types={max_types} must be >= 2 (the kept types and 'other')")
    done = [t for t in trajectories if not t.env_error]
    counts = Counter(validation_type(t.task_type) for t in done)
    kept = {name for name, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[: max_types - 1]}
    if len(counts) <= max_types:
        kept = set(counts)
    groups: dict[str, list[TrajectorySummary]] = defaultdict(list)
    for t in done:
        name = validation_type(t.task_type)
        groups[name if name in kept else "other"].append(t)
    out: dict[str, float] = {}
    for name, members in sorted(groups.items()):
        steps = sum(t.length for t in members)
        base = f"val-core/{data_source}/{name}"
        out[f"{base}/success"] = float(np.mean([float(t.won) for t in members]))
        out[f"{base}/length"] = float(np.mean([float(t.length) for t in members]))
        out[f"{base}/invalid_per_step"] = sum(t.num_invalid for t in members) / steps if steps else 0.0
        out[f"{base}/count"] = float(len(members))
    return out


def run_names(iteration: int, *, training: bool) -> dict[str, float]:
    """The local engine's run-level keys of one metrics line, under verl's names and its own (``training_step``)."""
    out = {"step": float(iteration), "training_step": float(iteration)}
    if training:
        out["training/global_step"] = float(iteration)
    return out


def val_names(data_source: str, val: dict[str, float], *, seconds: float) -> dict[str, float]:
    """verl's names for a local-engine validation: ``val-core/<data_source>/acc/mean@1`` (= ``val/success_rate``)
    and its seconds as ``timing_s/testing`` and ``timing_s/val``."""
    out = {"timing_s/testing": seconds, "timing_s/val": seconds}
    if "val/success_rate" in val:
        out[f"val-core/{data_source}/acc/mean@1"] = val["val/success_rate"]
    return out
