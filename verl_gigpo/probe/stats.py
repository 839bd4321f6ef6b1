"""What each anchor-key mode does to the step term on the same episodes, and which mode the probe recommends.

Over the M valid step rows of G episode groups, with the configured estimator's terms (``StepBatch.advantage_terms``)::

    anchor groups per episode group  = S / G       S = anchor groups (episode group, anchor key)
    shared groups per episode group  = S_2 / G     S_2 = anchor groups of 2 rows or more
    singleton rows                   = #{rows whose anchor group has 1 row} / M
    signal rows                      = #{rows with |A_S| > ZERO in a group with step signal} / M
    merged rows                      = #{rows whose anchor group holds more than one state key} / M
    flat groups                      = #{groups the episode filter drops} / G'
    signal-only groups               = #{flat groups where the estimator's terms carry signal} / G'

The definitions and the rule of :func:`recommend`: docs/probe.md ("The numbers", "The advice").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from verl_gigpo.config.rules import DEFAULT_GAMMA
from verl_gigpo.credit.stats import ZERO
from verl_gigpo.probe.keys import KeySpec
from verl_gigpo.rollout.dynamic import group_signal
from verl_gigpo.rollout.step_rows import StepBatch

__all__ = [
    "CLOSE",
    "FRAGMENTED",
    "MERGED_MAX",
    "KeyModeStats",
    "Recommendation",
    "key_mode_stats",
    "percent",
    "recommend",
]

#: signal-row fractions this close to the most count as a tie (then exact keys are preferred)
CLOSE = 0.02
#: singleton-row fraction at or above which the probe says that anchor groups do not form
FRAGMENTED = 0.9
#: merged-row fraction above which a mode is not recommended (it compares actions across different states)
MERGED_MAX = 0.05


@dataclass(frozen=True)
class KeyModeStats:
    """The step term's reach under one key mode (the fractions of the module docstring).

    ``rows`` M and ``episode_groups`` G count valid rows and groups; ``step_reward`` is c, the per-step reward taken off
    for ``signal_only_groups_no_step_reward``.
    """

    key: str
    rows: int
    episode_groups: int
    anchor_groups_per_group: float
    shared_groups_per_group: float
    singleton_rows: float
    signal_rows: float
    merged_rows: float
    flat_groups: float
    signal_only_groups: float
    signal_only_groups_no_step_reward: float = 0.0
    step_reward: float = 0.0

    def as_dict(self) -> dict[str, float | int | str]:
        """The fields as a JSON-ready dict."""
        return dataclasses.asdict(self)


def key_mode_stats(
    steps: StepBatch,
    anchor_keys: np.ndarray,
    spec: KeySpec,
    *,
    state_keys: np.ndarray,
    method: str = "gigpo",
    gamma: float = DEFAULT_GAMMA,
) -> KeyModeStats:
    """The numbers of one key mode: the estimator's terms on ``steps`` (N rows) with ``anchor_keys`` (N,) str.

    ``state_keys`` (N,) str: each row's ``state`` key, the reference of merged rows. All zeros when no row is valid.

    Raises:
        ValueError: ``anchor_keys`` or ``state_keys`` of another length than ``steps``; a bad method or gamma.
    """
    for name, column in (("anchor_keys", anchor_keys), ("state_keys", state_keys)):
        if len(column) != len(steps):
            raise ValueError(f"{name} has {len(column)} rows, the step batch {len(steps)}")
    batch = dataclasses.replace(steps, anchor_keys=np.asarray(anchor_keys, dtype=object))
    config = spec.gigpo_config(method=method, gamma=gamma)
    terms = batch.advantage_terms(config)
    valid = np.flatnonzero(terms.row_mask)  # (M,)
    if valid.size == 0:
        return KeyModeStats(spec.name, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    group, _ = pd.factorize(batch.group_ids[valid])  # (M,) episode group of each valid row, 0..G-1
    num_groups = int(group.max()) + 1
    anchor = terms.anchor_group[valid]  # (M,)
    size = terms.anchor_group_size[valid]  # (M,)
    signal = terms.step_signal[valid] & (np.abs(terms.step_adv[valid]) > ZERO)  # (M,)
    keep = group_signal(batch, "episode", config)  # the dynamic-sampling keep test, over the groups of batch
    decided = np.isin(keep.group_ids, batch.group_ids[valid])  # (G',) groups with an unmasked row
    flat = ~keep.episode[decided]  # (G',) dropped by the episode filter
    step_only = keep.dropped_with_step_signal[decided]  # (G',) dropped although the terms carry signal
    values, counts = np.unique(batch.step_rewards[valid], return_counts=True)
    cost = float(values[np.argmax(counts)])  # c: the most common step reward
    step_only_outcome = step_only
    if cost != 0.0:
        outcome = dataclasses.replace(
            batch, step_rewards=batch.step_rewards - cost, env_rewards=batch.env_rewards - cost
        )
        step_only_outcome = group_signal(outcome, "episode", config).dropped_with_step_signal[decided]  # (G',)
    distinct = np.unique(anchor)
    state, _ = pd.factorize(np.asarray(state_keys, dtype=object)[valid])  # (M,) state of each valid row
    pairs = np.unique(np.stack([anchor, state], axis=1), axis=0)  # (P, 2) distinct (anchor group, state)
    states_in = np.bincount(pairs[:, 0], minlength=int(anchor.max()) + 1)  # (S,) states per anchor group
    shared = np.unique(anchor[size >= 2])
    return KeyModeStats(
        key=spec.name,
        rows=int(valid.size),
        episode_groups=num_groups,
        anchor_groups_per_group=distinct.size / num_groups,
        shared_groups_per_group=shared.size / num_groups,
        singleton_rows=float(np.mean(size == 1)),
        signal_rows=float(np.mean(signal)),
        merged_rows=float(np.mean(states_in[anchor] > 1)),
        flat_groups=float(np.mean(flat)) if flat.size else 0.0,
        signal_only_groups=float(np.mean(step_only)) if step_only.size else 0.0,
        signal_only_groups_no_step_reward=float(np.mean(step_only_outcome)) if step_only.size else 0.0,
        step_reward=cost,
    )


@dataclass(frozen=True)
class Recommendation:
    """The probe's verdict: ``key`` (the mode the ``line`` is about), ``verdict`` (``"recommend"``, ``"fragmented"``
    or ``"no_signal"``) and the one ``line`` printed."""

    key: str
    verdict: str
    line: str


def _preference(spec: KeySpec) -> tuple[int, float]:
    """Sort key of the advice's rule 2: state, observation, history:K by K, similarity by falling threshold."""
    kind = spec.kind
    if kind == "similarity":
        return 3, -float(spec.similarity_threshold or 0.0)
    if kind == "history":
        return 2, float(spec.env_mode.split(":")[1])
    return (0, 0.0) if kind == "state" else (1, 0.0)


def recommend(stats: Sequence[KeyModeStats], specs: Sequence[KeySpec]) -> Recommendation:
    """The recommended key mode and its one-line reason, from one :class:`KeyModeStats` per mode of ``specs``.

    Raises:
        ValueError: no modes, or ``stats`` and ``specs`` that do not match.
    """
    if not stats or [s.key for s in stats] != [s.name for s in specs]:
        raise ValueError("recommend needs one KeyModeStats per KeySpec, in the same order")
    by_name = dict(zip([s.name for s in specs], stats, strict=True))
    candidates = [spec for spec in specs if by_name[spec.name].merged_rows <= MERGED_MAX] or list(specs)
    best = max((by_name[spec.name] for spec in candidates), key=lambda s: s.signal_rows)
    close = [spec for spec in candidates if by_name[spec.name].signal_rows >= best.signal_rows - CLOSE]
    pick_spec = min(close, key=_preference)
    pick = by_name[pick_spec.name]
    least = min(stats, key=lambda s: s.singleton_rows)
    top = max(stats, key=lambda s: s.signal_rows)
    if least.singleton_rows >= FRAGMENTED or pick.singleton_rows >= FRAGMENTED:
        about = least if top.signal_rows == 0.0 else pick
        return Recommendation(
            about.key,
            "fragmented",
            f"anchor groups hardly form: even with {about.key}, {percent(about.singleton_rows)} of rows are alone in "
            f"their anchor group and only {percent(about.signal_rows)} carry a step signal, so step credit will add "
            "little over the episode term (does the key hold the step index or other per-episode detail?)",
        )
    if top.signal_rows == 0.0:
        return Recommendation(
            least.key,
            "no_signal",
            f"no key mode gives a step signal on these episodes: anchor groups form (with {least.key}, "
            f"{percent(least.singleton_rows)} of rows are alone in theirs) but their step returns are all equal, and "
            f"{percent(least.flat_groups)} of episode groups have equal episode returns; step credit needs episodes "
            "that earn different rewards (a policy that sometimes succeeds, longer episodes, or more of them)",
        )
    if pick is best:
        reason = f"the most rows with a step signal ({percent(pick.signal_rows)})"
    else:
        reason = (
            f"{percent(pick.signal_rows, 1)} of rows with a step signal, within {CLOSE:.2f} of the most ({best.key}: "
            f"{percent(best.signal_rows, 1)}), and {_why_preferred(pick_spec, by_name[best.key], specs)}"
        )
    if top.signal_rows > best.signal_rows + CLOSE and top.merged_rows > MERGED_MAX:  # rule 1 left out a clear gain
        reason += (
            f" of the modes that keep states apart ({top.key} reaches {percent(top.signal_rows)} but puts "
            f"{percent(top.merged_rows)} of its rows in a group with another state)"
        )
    return Recommendation(
        pick.key,
        "recommend",
        f"recommended key mode: {pick.key}: {reason}; {percent(pick.singleton_rows)} of rows alone in their anchor "
        f"group, {percent(pick.signal_only_groups)} of episode groups with step signal only"
        + _without_step_reward(pick),
    )


def _why_preferred(pick: KeySpec, best: KeyModeStats, specs: Sequence[KeySpec]) -> str:
    other = next(s for s in specs if s.name == best.key)
    if other.kind == "similarity" and pick.kind != "similarity":
        return "exact keys are preferred over similarity (which can merge different states)"
    if other.kind == "similarity":
        return "a higher threshold merges fewer different states"
    if pick.kind == "state":
        return "the true state is preferred (texts can alias states; history splits them)"
    return "the coarser exact key is preferred"


def _without_step_reward(stats: KeyModeStats) -> str:
    """`` (Y% without the per-step reward c)`` when a per-step reward was taken off, else ``""``."""
    if stats.step_reward == 0.0:
        return ""
    return f" ({percent(stats.signal_only_groups_no_step_reward)} without the per-step reward {stats.step_reward:g})"


def percent(x: float, digits: int = 0) -> str:
    """``0.1234`` -> ``"12%"`` (``digits=1``: ``"12.3%"``)."""
    return f"{100 * x:.{digits}f}%"
