"""Settings of ``trainer.health``, ``trainer.v1.gigpo_sync`` (both engines) and the local engine's ``local``
section; each field declares its check. Keys: docs/configuration.md. Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from verl_gigpo import TRAINER_MODE
from verl_gigpo.config.keys import rename_deprecated
from verl_gigpo.config.rules import check_settings, choice, flag, number, whole

__all__ = ["HEALTH_ACTIONS", "HEALTH_SIGNALS", "HealthOptions", "LocalSettings", "UpdateSettings"]

HEALTH_ACTIONS = ("warn", "stop")
"""Values of ``trainer.health.action``: ``warn`` logs the alarm; ``stop`` also saves a checkpoint and ends the run."""

HEALTH_SIGNALS = (
    "success_drop",
    "invalid_rise",
    "entropy_collapse",
    "entropy_explode",
    "kl_spike",
    "clipfrac_spike",
    "logprob_gap",
    "grad_norm_nonfinite",
    "grad_norm_spike",
    "length_limit",
    "no_step_signal",
    "singleton_anchors",
    "flat_groups",
)
"""The alarms of :mod:`verl_gigpo.rollout.health`, in the order they are checked; ``trainer.health.ignore`` takes
these names."""

_SHARE = "a share"
_THRESHOLD = "a threshold (docs/metrics.md#health)"


def _share(default: float) -> Any:
    return number(default, _SHARE, low=0, high=1)


def _positive(default: float) -> Any:
    return number(default, _THRESHOLD, low=0, low_open=True)


@dataclass(frozen=True)
class HealthOptions:
    """``trainer.health.*`` on both engines (docs/configuration.md; the thresholds: docs/watching-a-run.md)."""

    enable: bool = flag(True, "check the run's health")
    action: str = choice("warn", HEALTH_ACTIONS, "what an alarm does")
    window: int = whole(10, "iterations of a windowed mean", low=1)
    baseline: int = whole(3, "early values averaged", low=1)
    warmup: int = whole(10, "iterations", low=0)
    cooldown: int = whole(20, "iterations", low=0)
    ignore: tuple[str, ...] = ()
    success_drop: float = _share(0.5)
    invalid_rise: float = _share(0.015)
    invalid_ratio: float = _positive(2.0)
    entropy_low: float = _positive(0.3)
    entropy_high: float = _positive(3.0)
    kl_max: float = _positive(1.0)
    clipfrac_max: float = _share(0.3)
    logprob_gap_max: float = _positive(0.5)
    grad_norm_ratio: float = _positive(10.0)
    grad_norm_floor: float = _positive(0.1)
    length_limit_rise: float = _share(0.2)
    step_signal_min: float = _share(0.02)
    singleton_max: float = _share(0.95)
    flat_max: float = _share(0.95)

    def __post_init__(self) -> None:
        check_settings(self, "trainer.health")
        unknown = [s for s in self.ignore if s not in HEALTH_SIGNALS]
        if unknown:
            raise ValueError(
                f"trainer.health.ignore={list(self.ignore)}: unknown signal(s) {unknown}; use names of "
                f"{list(HEALTH_SIGNALS)}"
            )

    @classmethod
    def from_trainer(cls, trainer: Mapping[str, Any] | None) -> HealthOptions:
        """Read ``trainer.health`` (deprecated spellings renamed with a warning); ValueError names a bad key."""
        section = dict((trainer or {}).get("health", None) or {})
        rename_deprecated(section, "trainer.health")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(section) - known)
        if unknown:
            raise ValueError(f"trainer.health has unknown key(s) {unknown}; known: {sorted(known)}")
        if "ignore" in section:
            ignore = section["ignore"]
            section["ignore"] = (ignore,) if isinstance(ignore, str) else tuple(str(s) for s in ignore or ())
        return cls(**section)


@dataclass(frozen=True)
class UpdateSettings:
    """How an iteration's step rows are split into optimizer steps (``trainer.v1.gigpo_sync``, docs/configuration.md);
    ``logprob_check_freq`` is verl's only."""

    mini_batch_rows: int | None = whole(
        256,
        "most step rows per optimizer step, e.g. 256 as the reference's ALFWorld run; null = verl's own split by tasks",
        low=1,
        nullable=True,
    )
    shuffle_rows: bool = flag(True, "shuffle the rows across groups")
    logprob_check_freq: int = whole(
        10,
        "in bypass mode, recompute the old log-probs with the actor every N iterations to log the rollout-vs-actor "
        "gap; 0 = never",
        low=0,
    )

    def __post_init__(self) -> None:
        check_settings(self, f"trainer.v1.{TRAINER_MODE}")

    @classmethod
    def from_config(cls, config: Any) -> UpdateSettings:
        """Read ``trainer.v1.gigpo_sync`` (missing keys: defaults); ValueError names a bad key."""
        node = ((config.get("trainer") or {}).get("v1") or {}).get(TRAINER_MODE) or {}
        known = tuple(f.name for f in fields(cls))
        unknown = sorted(str(k) for k in node if k not in known)
        if unknown:
            raise ValueError(f"unknown key(s) {unknown} in trainer.v1.{TRAINER_MODE}; known: {', '.join(known)}")
        return cls(**{k: node[k] for k in known if k in node})


@dataclass(frozen=True)
class LocalSettings:
    """The local engine's ``local.*`` keys (``local_trainer.yaml`` says what each does)."""

    constrain_to_actions: bool = flag(True, "decode action tokens only")
    max_batch_size: int = whole(512, "requests per batched generation", low=1)
    env_workers: int = whole(0, "environment threads, 0 = inline", low=0)
    num_threads: int | None = whole(None, "torch threads, null = torch's default", low=1, nullable=True)
    progress: bool = flag(True, "progress bar")
    plot: bool = flag(True, "write learning_curve.png")

    def __post_init__(self) -> None:
        check_settings(self, "local")

    @classmethod
    def from_section(cls, section: Mapping[str, Any] | None) -> LocalSettings:
        """Read ``local`` (missing keys: defaults); ValueError names a bad key."""
        section = dict(section or {})
        known = [f.name for f in fields(cls)]
        unknown = sorted(str(k) for k in section if k not in known)
        if unknown:
            raise ValueError(f"local has unknown key(s) {unknown}; known: {known}")
        return cls(**section)
