"""The probe end to end: options (checked once, errors naming the command-line option), play, numbers, verdict."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from verl_gigpo import STEP_CREDIT_ESTIMATORS
from verl_gigpo.config.rules import DEFAULT_GAMMA, Range, group_size_warning
from verl_gigpo.probe.keys import DEFAULT_KEYS, KeySpec, parse_keys
from verl_gigpo.probe.play import PlayedEpisodes, play_model, play_random, split_max_steps
from verl_gigpo.probe.stats import KeyModeStats, Recommendation, key_mode_stats, recommend

__all__ = ["ProbeOptions", "ProbeResult", "run_probe"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProbeOptions:
    """What to probe; each field is the command-line option of the same name (docs/probe.md has the table).

    ``env_kwargs``: the environment's constructor arguments (``max_steps`` sets the step limit; ``key_mode`` is
    refused). ``registry``: ``env.registry`` entries for a user's environment (filled by the CLI).

    Raises:
        ValueError: a bad value, naming the option.
    """

    env: str = "gridnav"
    groups: int = 16
    n: int = 8
    keys: str | Sequence[KeySpec] = DEFAULT_KEYS
    split: str | None = None
    seed: int = 0
    model: str | None = None
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)
    method: str = "gigpo"
    gamma: float = DEFAULT_GAMMA
    device: str | None = None
    overrides: Sequence[str] = ()
    registry: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        Range("--groups", "int", "episode groups (tasks) to play", low=1).check(self.groups)
        Range("-n", "int", "episodes per group", low=1).check(self.n)
        if isinstance(self.keys, str):
            object.__setattr__(self, "keys", tuple(parse_keys(self.keys)))
        elif not self.keys or not all(isinstance(k, KeySpec) for k in self.keys):
            raise ValueError(f"--keys: give key modes, e.g. {DEFAULT_KEYS}")
        Range("--seed", "int", "seed of the task draw and the rollout", low=0).check(self.seed)
        if self.method not in STEP_CREDIT_ESTIMATORS:
            raise ValueError(f"--method {self.method!r}: use one of {', '.join(STEP_CREDIT_ESTIMATORS)}")
        Range("--gamma", "float", "the discount", low=0, high=1).check(self.gamma)
        split_max_steps(self.env_kwargs)  # refuses key_mode
        if self.model is None:
            if self.overrides or self.device is not None:
                raise ValueError("--set and --device configure the model's rollout; give --model too")
            return
        if not (Path(self.model) / "config.json").is_file():
            raise ValueError(
                f"--model {self.model}: not a Hugging Face model folder (no config.json); export a checkpoint with "
                "python -m verl_gigpo.export CKPT --out DIR"
            )
        bad = [o for o in self.overrides if "=" not in o]
        if bad:
            raise ValueError(f"--set {bad[0]!r}: not key=value (a key of the local engine's config)")

    @property
    def key_specs(self) -> tuple[KeySpec, ...]:
        """The key modes as :class:`KeySpec`."""
        return tuple(self.keys)  # type: ignore[arg-type]  # parsed in __post_init__

    @property
    def env_modes(self) -> list[str]:
        """The environment key modes to read, each once: ``state`` first, then those of the key modes."""
        return list(dict.fromkeys(["state", *(spec.env_mode for spec in self.key_specs)]))


@dataclass(frozen=True)
class ProbeResult:
    """What the probe found: the episodes' summary (``episodes``, ``rows``, ``failed``, ``mean_length``, ``success``,
    ``invalid``), one :class:`KeyModeStats` per key mode in ``--keys`` order, and the ``recommendation``."""

    options: ProbeOptions
    policy: str
    split: str
    max_steps: int
    episodes: int
    rows: int
    failed: int
    mean_length: float
    success: float
    invalid: float
    stats: list[KeyModeStats]
    recommendation: Recommendation

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (``summary.json``)."""
        opts = self.options
        return {
            "env": opts.env,
            "env_kwargs": dict(opts.env_kwargs),
            "split": self.split,
            "max_steps": self.max_steps,
            "groups": opts.groups,
            "episodes_per_group": opts.n,
            "policy": self.policy,
            "model": opts.model,
            "seed": opts.seed,
            "method": opts.method,
            "gamma": opts.gamma,
            "keys": [spec.name for spec in opts.key_specs],
            "episodes": self.episodes,
            "rows": self.rows,
            "failed_episodes": self.failed,
            "mean_length": self.mean_length,
            "success": self.success,
            "invalid_actions": self.invalid,
            "stats": [s.as_dict() for s in self.stats],
            "recommendation": {
                "key": self.recommendation.key,
                "verdict": self.recommendation.verdict,
                "line": self.recommendation.line,
            },
        }


def run_probe(options: ProbeOptions, *, progress: bool = False) -> ProbeResult:
    """Play the episodes once, measure every key mode on them and recommend one.

    Raises:
        ValueError: an unknown environment, split or constructor argument; a bad local-engine setting.
        ProbeError, EnvError: see :mod:`verl_gigpo.probe.play`.
    """
    warning = group_size_warning(options.method, options.n)
    if warning:
        logger.warning("%s", warning.replace("actor_rollout_ref.rollout.n=1", "-n 1"))
    played = _play(options, progress)
    steps = played.steps
    stats = [
        key_mode_stats(
            steps,
            played.keys[spec.env_mode],
            spec,
            state_keys=played.keys["state"],
            method=options.method,
            gamma=options.gamma,
        )
        for spec in options.key_specs
    ]
    episodes = played.episodes
    ok = [ep for ep in episodes if ep.env_error is None]
    num_steps = sum(ep.length for ep in ok)
    return ProbeResult(
        options=options,
        policy=played.policy,
        split=episodes[0].task.split,
        max_steps=played.max_steps,
        episodes=len(episodes),
        rows=len(steps),
        failed=len(episodes) - len(ok),
        mean_length=float(np.mean([ep.length for ep in ok])) if ok else 0.0,
        success=float(np.mean([ep.won for ep in ok])) if ok else 0.0,
        invalid=sum(ep.num_invalid for ep in ok) / num_steps if num_steps else 0.0,
        stats=stats,
        recommendation=recommend(stats, options.key_specs),
    )


def _play(options: ProbeOptions, progress: bool) -> PlayedEpisodes:
    common = {
        "groups": options.groups,
        "n": options.n,
        "modes": options.env_modes,
        "split": options.split,
        "seed": options.seed,
        "env_kwargs": options.env_kwargs,
        "progress": progress,
    }
    if options.model is None:
        return play_random(options.env, **common)
    return play_model(
        options.model,
        options.env,
        overrides=options.overrides,
        registry=options.registry,
        device=options.device,
        **common,
    )
