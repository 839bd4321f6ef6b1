"""Dynamic sampling: which episode groups carry a learning signal, and how rounds of fresh tasks fill a batch.

    options = DynamicSampling.from_algorithm(cfg.algorithm)       # algorithm.filter_groups, checked
    signal = group_signal(steps, options.filter, gigpo)            # per episode group: keep or drop, and why
    rounds = DynamicRounds(options, target=data.train_batch_size)  # one iteration's rounds
    rounds.add(steps, signal); ...; rounds.selected(); rounds.metrics()

One keep test for both engines, on either engine's step rows::

    episode(g) = |C_g| >= 2 and the episode scores S(tau) of g's finished trajectories differ
    keep(g)    = episode(g)  (filter "episode")  |  episode(g) or a row's estimator term has signal  ("signal")

The keep test, the rounds and the metrics: docs/dynamic-sampling.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from verl_gigpo import STEP_CREDIT_ESTIMATORS
from verl_gigpo.config.rules import Range
from verl_gigpo.rollout.step_rows import StepBatch

__all__ = [
    "FILTERS",
    "SECTION",
    "DynamicRounds",
    "DynamicSampling",
    "GroupRecord",
    "GroupSignal",
    "dynamic_metrics",
    "group_records",
    "group_signal",
]

#: the config section of the options, verl's own (``algorithm.filter_groups``, DAPO's), plus the key ``filter``
SECTION = "algorithm.filter_groups"

#: values of ``algorithm.filter_groups.filter`` (docs/dynamic-sampling.md)
FILTERS = ("episode", "signal")

#: the keys of verl's ``algorithm.filter_groups`` (ppo_trainer.yaml, ``FilterGroupsConfig``) that are not ours:
#: ``metric`` must be ``reward`` (or null) when enabled; ``max_inflight_gen_batches`` is read by verl's pipeline only
_VERL_KEYS = ("_target_", "metric", "max_inflight_gen_batches")
_KEYS = ("enable", "filter", "max_num_gen_batches")


@dataclass(frozen=True)
class DynamicSampling:
    """The options of dynamic sampling (``algorithm.filter_groups``; keys in docs/dynamic-sampling.md).

    ``max_rounds`` is ``max_num_gen_batches``. Raises ValueError naming the key on a bad value.
    """

    enable: bool = False
    filter: str = "episode"
    max_rounds: int = 10

    def __post_init__(self) -> None:
        Range(f"{SECTION}.enable", "bool", "dynamic sampling of episode groups").check(self.enable)
        if self.filter not in FILTERS:
            raise ValueError(
                f"{SECTION}.filter={self.filter!r} must be 'episode' (keep a group whose episode returns are not all "
                "equal, the reference's dynamic GiGPO) or 'signal' (also keep one whose step term is nonzero)"
            )
        Range(
            f"{SECTION}.max_num_gen_batches",
            "int",
            "most rounds of data.train_batch_size tasks per iteration, the first included; the reference's dynamic "
            "GiGPO: 10",
            low=1 if self.enable else None,
        ).check(self.max_rounds)

    @classmethod
    def from_algorithm(cls, algorithm: Any) -> DynamicSampling:
        """Read and check ``algorithm.filter_groups`` (missing: off) against ``algorithm.adv_estimator``.

        Raises ValueError naming the key: unknown key, bad value, ``metric`` not ``reward``, or ``filter=signal``
        without a step-credit estimator.
        """
        algorithm = {} if algorithm is None else algorithm
        section = algorithm.get("filter_groups", None)
        if section is None:
            return cls()
        if not isinstance(section, Mapping) and not hasattr(section, "items"):
            raise ValueError(f"{SECTION} must be a mapping of {list(_KEYS)}, got {section!r}")
        section = dict(section.items())
        unknown = sorted(str(k) for k in section if k not in (*_KEYS, *_VERL_KEYS))
        if unknown:
            raise ValueError(f"unknown {SECTION} key(s) {unknown}; known keys: {[*_KEYS, *_VERL_KEYS[1:]]}")
        values = {
            "enable": section.get("enable", cls.enable),
            "filter": section.get("filter", None) or cls.filter,
            "max_rounds": section.get("max_num_gen_batches", cls.max_rounds),
        }
        options = cls(**values)
        if not options.enable:
            return options
        metric = section.get("metric", None)
        if metric not in (None, "reward"):
            raise ValueError(
                f"{SECTION}.metric={metric!r}: dynamic sampling here compares each group's episode returns "
                f"(metric=reward, verl's default); choose what keeps a group with {SECTION}.filter=episode|signal"
            )
        estimator = algorithm.get("adv_estimator", None)
        if options.filter == "signal" and estimator not in STEP_CREDIT_ESTIMATORS:
            raise ValueError(
                f"{SECTION}.filter=signal needs a step-credit estimator (algorithm.adv_estimator one of "
                f"{list(STEP_CREDIT_ESTIMATORS)}), got algorithm.adv_estimator={estimator!r}, which has no step term; "
                f"use {SECTION}.filter=episode"
            )
        return options


@dataclass(frozen=True)
class GroupSignal:
    """The keep decision of every episode group of one batch of step rows (:func:`group_signal`).

    All arrays ``(G,)`` in order of first appearance: ``group_ids`` object; ``episode``, ``step`` (step term has
    signal), ``episode_term`` (episode term has signal), ``keep`` bool; ``score`` float64, the group's highest
    finished episode score (0 if none).
    """

    group_ids: np.ndarray
    episode: np.ndarray
    step: np.ndarray
    keep: np.ndarray
    filter: str
    score: np.ndarray
    episode_term: np.ndarray

    @property
    def step_only(self) -> np.ndarray:
        """``(G,)`` bool: kept although the episode filter drops it (kept for the estimator's terms alone)."""
        return self.keep & ~self.episode

    @property
    def dropped_with_step_signal(self) -> np.ndarray:
        """``(G,)`` bool: dropped although the estimator's terms carry signal (the ``episode`` filter's loss)."""
        return ~self.keep & (self.step | self.episode_term)

    def kept(self) -> list[str]:
        """The ids of the kept groups, in order."""
        return [str(g) for g in self.group_ids[self.keep]]


def group_signal(steps: StepBatch, filter: str, gigpo: Any = None, *, penalty_mode: str = "reward") -> GroupSignal:
    """Keep or drop each episode group of ``steps`` (N rows) by ``filter`` (docs/dynamic-sampling.md#the-keep-test).

    ``gigpo`` is the step-credit estimator's settings (None for grpo/rloo, then ``penalty_mode`` picks the score).
    Raises ValueError on an unknown ``filter`` or ``"signal"`` without ``gigpo``.
    """
    if filter not in FILTERS:
        raise ValueError(f"{SECTION}.filter={filter!r} must be one of {list(FILTERS)}")
    if filter == "signal" and gigpo is None:
        raise ValueError(f"{SECTION}.filter=signal needs a step-credit estimator's settings (gigpo=GiGPOConfig)")
    from verl_gigpo.advantage import differs_in_groups  # the estimators' own rule (imports torch)

    mode = gigpo.penalty_mode if gigpo is not None else penalty_mode
    real = np.flatnonzero(~steps.padding)  # (M,)
    codes, uniques = pd.factorize(steps.group_ids[real])  # (M,) group of each real row, 0..G-1
    num = len(uniques)
    group_of = {g: i for i, g in enumerate(uniques)}

    _, returns, traj_groups = steps.trajectory_scores(env_rewards=mode == "reference")  # (T,), (T,)
    t_codes = np.array([group_of[g] for g in traj_groups], dtype=np.int64)  # (T,)
    count = np.bincount(t_codes, minlength=num)  # (G,) unmasked trajectories
    episode = (count >= 2) & differs_in_groups(returns, t_codes, num)  # (G,)
    hi = np.full(num, -np.inf)
    np.maximum.at(hi, t_codes, returns)

    step = np.zeros(num, dtype=bool)
    episode_term = np.zeros(num, dtype=bool)
    if gigpo is not None and steps.row_mask.any():
        terms = steps.advantage_terms(gigpo)  # masked rows: no signal
        live = steps.row_mask[real]  # (M,)
        for flags, out in ((terms.step_signal, step), (terms.episode_signal, episode_term)):
            out[:] = np.bincount(codes, weights=(live & flags[real]).astype(np.float64), minlength=num) > 0
    keep = episode if filter == "episode" else episode | step | episode_term
    return GroupSignal(
        group_ids=np.asarray(uniques, dtype=object),
        episode=episode,
        step=step,
        keep=keep.copy(),
        filter=filter,
        score=np.where(count > 0, hi, 0.0),
        episode_term=episode_term,
    )


@dataclass(frozen=True)
class GroupRecord:
    """One played episode group: its round (1, 2, ...), the filter's flags (as :class:`GroupSignal`; ``step``: either
    term has signal) and its episodes played, finished (no environment failure) and won."""

    group_id: str
    round: int
    keep: bool
    episode: bool
    step: bool
    episodes: int
    finished: int
    won: int


def group_records(steps: StepBatch, signal: GroupSignal, round: int) -> list[GroupRecord]:
    """One :class:`GroupRecord` per group of ``signal`` (decided on ``steps``), in its order, for round ``round``."""
    real = np.flatnonzero(~steps.padding)  # (M,)
    t_codes, _ = pd.factorize(steps.traj_ids[real])  # (M,) trajectory of each real row
    num = int(t_codes.max()) + 1 if t_codes.size else 0
    first = np.full(num, real.size, dtype=np.int64)
    np.minimum.at(first, t_codes, np.arange(real.size))
    first = real[first]  # (T,) batch position of each trajectory's first real row
    failed = np.zeros(num, dtype=bool)
    won = np.zeros(num, dtype=bool)
    np.logical_or.at(failed, t_codes, steps.env_error[real].astype(bool))
    np.logical_or.at(won, t_codes, steps.won[real].astype(bool))
    index = {str(g): i for i, g in enumerate(signal.group_ids)}
    owner = np.array([index.get(str(g), -1) for g in steps.group_ids[first]], dtype=np.int64)  # (T,) its group
    ours = owner >= 0  # (T,) trajectories of the groups of signal

    def per_group(flags: np.ndarray) -> np.ndarray:
        return np.bincount(owner[ours & flags], minlength=len(index))  # (G,)

    episodes, finished, wins = per_group(np.ones(num, bool)), per_group(~failed), per_group(~failed & won)
    records = [
        GroupRecord(
            group_id=str(group),
            round=round,
            keep=bool(signal.keep[i]),
            episode=bool(signal.episode[i]),
            step=bool(signal.step[i] or signal.episode_term[i]),
            episodes=int(episodes[i]),
            finished=int(finished[i]),
            won=int(wins[i]),
        )
        for i, group in enumerate(signal.group_ids)
    ]
    return records


def dynamic_metrics(records: list[GroupRecord], selected: list[str] | set[str], target: int) -> dict[str, float]:
    """The ``dynamic/*`` metrics of one iteration (defined in docs/metrics.md), for both engines.

    ``records``: every group played; ``selected``: ids trained on; ``target``: ``data.train_batch_size``.
    """
    chosen = set(selected)
    rounds = max((r.round for r in records), default=0)
    kept = sum(r.keep for r in records)
    kept_in_batch = sum(r.keep and r.group_id in chosen for r in records)
    episodes = sum(r.episodes for r in records)
    finished = sum(r.finished for r in records)
    out = {"dynamic/rounds": float(rounds)}
    for k in range(1, rounds + 1):
        played = [r.keep for r in records if r.round == k]
        out[f"dynamic/kept_fraction_round_{k}"] = sum(played) / len(played) if played else 0.0
    out.update(
        {
            "dynamic/kept_fraction": kept / len(records) if records else 0.0,
            "dynamic/kept_groups": float(kept_in_batch),
            "dynamic/kept_by_step_signal_only": float(
                sum(r.keep and not r.episode and r.group_id in chosen for r in records)
            ),
            "dynamic/dropped_with_step_signal": float(sum(r.step and not r.keep for r in records)),
            "dynamic/short_groups": float(max(0, target - kept_in_batch)),
            "dynamic/surplus_groups": float(kept - kept_in_batch),
            "dynamic/episodes_played": float(episodes),
            "dynamic/episodes_per_kept_group": episodes / max(kept_in_batch, 1),
            "dynamic/played_success_rate": sum(r.won for r in records) / finished if finished else 0.0,
        }
    )
    return out


@dataclass
class DynamicRounds:
    """The rounds of one local-engine iteration: ``while not rounds.done: rounds.add(...)``, then :meth:`selected`
    and :meth:`metrics`. ``target`` is ``data.train_batch_size``."""

    options: DynamicSampling
    target: int
    records: list[GroupRecord] = field(default_factory=list)
    num_rounds: int = 0

    def add(self, steps: StepBatch, signal: GroupSignal) -> None:
        """Record a round's decisions. Raises RuntimeError after the last round, ValueError on a repeated group id."""
        if self.done:
            raise RuntimeError(f"no round after the last: {self.num_rounds} round(s), {self.kept_count} kept")
        repeated = sorted({r.group_id for r in self.records} & {str(g) for g in signal.group_ids})
        if repeated:
            raise ValueError(f"group ids {repeated[:5]} were played in an earlier round: each round needs fresh ids")
        self.num_rounds += 1
        self.records += group_records(steps, signal, self.num_rounds)

    @property
    def kept_count(self) -> int:
        """Groups the filter kept so far (all rounds, before trimming)."""
        return sum(r.keep for r in self.records)

    @property
    def done(self) -> bool:
        """The kept groups fill the batch, or ``max_rounds`` rounds were played."""
        return self.kept_count >= self.target or self.num_rounds >= self.options.max_rounds

    def selected(self) -> list[str]:
        """The first ``target`` kept group ids in play order, topped up with the last round's dropped groups."""
        kept = [r.group_id for r in self.records if r.keep][: self.target]
        fill = [r.group_id for r in self.records if r.round == self.num_rounds and not r.keep]
        return kept + fill[: max(0, self.target - len(kept))]

    def metrics(self) -> dict[str, float]:
        """``dynamic/*`` of the iteration: :func:`dynamic_metrics` of its groups and :meth:`selected`."""
        return dynamic_metrics(self.records, self.selected(), self.target)
