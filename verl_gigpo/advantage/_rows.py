"""Row helpers shared by every estimator: trajectory structure, anchor groups, returns, group statistics.

docs/adding-an-estimator.md, "The shared row helpers", says what each computes and why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from verl_gigpo.advantage._ids import as_id_array, id_codes, pair_codes, show
from verl_gigpo.advantage._inputs import as_response_mask, as_rewards, as_row_mask, as_row_penalty, as_step_ids
from verl_gigpo.advantage.anchors import anchor_group_ids, check_similarity_threshold
from verl_gigpo.advantage.interface import CommonOptions, StepRows

__all__ = [
    "AT_MEAN_RTOL",
    "SIGNAL_ATOL",
    "SIGNAL_RTOL",
    "Basis",
    "ValidRows",
    "anchor_groups",
    "at_group_mean",
    "basis",
    "check_overflow",
    "differs_in_groups",
    "discounted_step_returns",
    "episode_advantage",
    "episode_at_mean",
    "group_means",
    "normalise_in_groups",
    "prepare_rows",
    "step_returns",
]


# ---------------------------------------------------------------------------------------------------- rows
@dataclass(frozen=True)
class ValidRows:
    """The M valid rows of a batch of N and their structure (T trajectories, G episode groups).

    ``rows``, ``r``, ``steps``, ``t``, ``g``, ``order``, ``pos``, ``prev``, ``next``: (M,) per valid row (``pos``:
    position in its trajectory in step-id order; ``prev``/``next``: valid-row index of the neighbouring step, or -1);
    ``traj_group``, ``traj_len``: (T,); ``valid``, ``traj_ids``, ``anchor_keys``: (N,) as given.
    """

    n: int
    valid: np.ndarray
    rows: np.ndarray
    r: np.ndarray
    steps: np.ndarray
    t: np.ndarray
    traj_group: np.ndarray
    g: np.ndarray
    num_trajs: int
    num_groups: int
    order: np.ndarray
    pos: np.ndarray
    traj_len: np.ndarray
    prev: np.ndarray
    next: np.ndarray
    traj_ids: np.ndarray
    anchor_keys: np.ndarray

    @property
    def m(self) -> int:
        """Valid rows M."""
        return int(self.rows.shape[0])

    def scatter(self, x: np.ndarray, dtype: Any = np.float64, fill: Any = 0) -> np.ndarray:
        """(M,) values of the valid rows into an (N,) array, ``fill`` elsewhere."""
        out = np.full(self.n, fill, dtype=dtype)
        out[self.rows] = x
        return out

    def per_trajectory(self, flags: np.ndarray, name: str) -> np.ndarray:
        """An (N,) bool flag equal on every row of a trajectory (``won``), as (T,); raises if rows disagree."""
        f = flags[self.rows]  # (M,)
        count = np.bincount(self.t, weights=f.astype(np.float64), minlength=self.num_trajs)  # (T,)
        mixed = np.flatnonzero((count > 0) & (count < self.traj_len))
        if mixed.size:
            members = np.flatnonzero(self.t == mixed[0])
            yes, no = self.rows[members[f[members]][0]], self.rows[members[~f[members]][0]]
            raise ValueError(
                f"{name} differs within trajectory traj_ids = {show(self.traj_ids[yes])}: True at row {yes}, False "
                f"at row {no}; {name} describes the whole episode, so every row of a trajectory carries the same value"
            )
        return count > 0


def prepare_rows(inputs: StepRows) -> ValidRows:
    """Check the per-row inputs of ``inputs`` and work out the trajectory structure of the valid rows."""
    rewards = as_rewards(inputs.step_rewards)  # (N,) float64
    n = rewards.shape[0]
    as_response_mask(inputs.response_mask, n)
    valid = as_row_mask(inputs.row_mask, n)  # (N,) bool
    groups = as_id_array(inputs.group_ids, "group_ids", n)
    trajs = as_id_array(inputs.traj_ids, "traj_ids", n)
    anchors = as_id_array(inputs.anchor_keys, "anchor_keys", n)
    steps_raw = as_id_array(inputs.step_ids, "step_ids", n)
    rows = np.flatnonzero(valid)  # (M,) positions of the valid rows
    r = rewards[rows]  # (M,)
    bad = np.flatnonzero(~np.isfinite(r))
    if bad.size:
        i = int(rows[bad[0]])
        raise ValueError(
            f"step_rewards[{i}] = {show(rewards[i])} is not finite ({bad.size} non-finite reward(s) among valid rows; "
            f"first bad row {i}): fix the reward source, or mark the row with row_mask=False to ignore it"
        )
    steps = as_step_ids(steps_raw[rows], rows)  # (M,) int64
    t, traj_group = _trajectory_codes(rows, trajs, groups)
    order, pos, prev, nxt = _step_order(rows, t, steps, trajs, steps_raw)
    return ValidRows(
        n=n,
        valid=valid,
        rows=rows,
        r=r,
        steps=steps,
        t=t,
        traj_group=traj_group,
        g=traj_group[t],
        num_trajs=traj_group.shape[0],
        num_groups=int(traj_group.max(initial=-1)) + 1,
        order=order,
        pos=pos,
        traj_len=np.bincount(t, minlength=traj_group.shape[0]),
        prev=prev,
        next=nxt,
        traj_ids=trajs,
        anchor_keys=anchors,
    )


def _trajectory_codes(rows: np.ndarray, trajs: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Trajectory codes (M,) of the valid rows and the episode group code (T,) of each trajectory."""
    t = id_codes(trajs[rows], "traj_ids", rows)  # (M,) in [0, T)
    num_trajs = int(t.max(initial=-1)) + 1
    rep = np.empty(num_trajs, dtype=np.int64)  # (T,) one valid row of each trajectory
    rep[t] = rows
    traj_group = id_codes(groups[rep], "group_ids", rep)  # (T,)
    row_groups = groups[rows]  # (M,)
    split = np.flatnonzero(~np.asarray(row_groups == groups[rep][t], dtype=bool))
    if split.size:
        k = int(split[0])
        i, j = int(rows[k]), int(rep[t[k]])
        if pd.isna(row_groups[k]):
            raise ValueError(f"group_ids[{i}] is missing ({show(row_groups[k])}); every valid row needs an id")
        raise ValueError(
            f"trajectory traj_ids[{i}] = {show(trajs[i])} appears in two episode groups: {show(groups[i])} "
            f"(row {i}) and {show(groups[j])} (row {j}); every row of a trajectory must carry the same group id"
        )
    return t, traj_group


def _step_order(
    rows: np.ndarray, t: np.ndarray, steps: np.ndarray, trajs: np.ndarray, steps_raw: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Step-order permutation, position in trajectory, previous and next step (-1 at the ends), each (M,)."""
    m = rows.shape[0]
    order = _order_by_traj_step(t, steps)  # (M,)
    t_sorted, s_sorted = t[order], steps[order]
    dup = np.flatnonzero((t_sorted[1:] == t_sorted[:-1]) & (s_sorted[1:] == s_sorted[:-1]))
    if dup.size:
        i, j = sorted((int(rows[order[dup[0]]]), int(rows[order[dup[0] + 1]])))
        raise ValueError(
            f"duplicate (traj id, step id) among valid rows: rows {i} and {j} both have traj_ids = {show(trajs[i])}, "
            f"step_ids = {int(steps_raw[i])}; each step of a trajectory must appear once (mark padding or "
            "duplicated copies with row_mask=False)"
        )
    same = t_sorted[1:] == t_sorted[:-1]  # (M-1,) sorted neighbours in one trajectory
    prev = np.full(m, -1, dtype=np.int64)
    nxt = np.full(m, -1, dtype=np.int64)
    nxt[order[:-1][same]] = order[1:][same]
    prev[order[1:][same]] = order[:-1][same]
    starts = np.flatnonzero(np.r_[True, ~same]) if m else np.zeros(0, dtype=np.int64)
    pos = np.empty(m, dtype=np.int64)
    pos[order] = np.arange(m) - np.repeat(starts, np.diff(np.r_[starts, m]))
    return order, pos, prev, nxt


def _order_by_traj_step(t: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """Permutation sorting rows by (trajectory code, step id)."""
    if t.size == 0:
        return np.zeros(0, dtype=np.int64)
    lo, hi = int(steps.min()), int(steps.max())
    span = hi - lo + 1
    if (int(t.max()) + 1) * span < 2**62:  # one int64 key: faster than lexsort
        return np.argsort(t * span + (steps - lo))
    return np.lexsort((steps, t))


def anchor_groups(rows: ValidRows, similarity_threshold: float | None) -> tuple[np.ndarray, int]:
    """Anchor-group codes (M,) of the valid rows: (episode group, key), merged by similarity if t < 1; and the count."""
    keys = rows.anchor_keys[rows.rows]  # (M,)
    if similarity_threshold in (None, 1.0):
        return pair_codes(rows.g, id_codes(keys, "anchor_keys", rows.rows))
    not_str = [k for k, v in enumerate(keys.tolist()) if not isinstance(v, str)]
    if not_str:
        k = not_str[0]
        raise ValueError(
            f"anchor_keys[{int(rows.rows[k])}] = {show(keys[k])} is a {type(keys[k]).__name__}; similarity grouping "
            f"(similarity_threshold={similarity_threshold}, GiGPOConfig key_mode='similarity') compares observation "
            "texts, so every valid row needs a str key: build the environment with key_mode='observation' "
            "(GiGPOConfig.env_key_mode), or use exact keys (similarity_threshold=None)"
        )
    merged = anchor_group_ids(keys, rows.g, check_similarity_threshold(similarity_threshold))  # (M,)
    return pair_codes(rows.g, merged)


# ---------------------------------------------------------------------------------------------------- maths
@dataclass(frozen=True)
class Basis:
    """What every estimator computes alike from a batch (M valid rows, T trajectories, G episode groups).

    ``s_group`` (M,) anchor groups (``num_s``); ``R_t`` (M,) minus the row penalty; ``R_traj`` (T,) episode returns;
    ``R_row = R_traj - penalty`` (M,); ``A_E`` (M,); ``flat_groups`` (G,); ``episode_signal`` (M,).
    """

    rows: ValidRows
    s_group: np.ndarray
    num_s: int
    R_t: np.ndarray
    R_traj: np.ndarray
    R_row: np.ndarray
    penalty: np.ndarray
    A_E: np.ndarray
    flat_groups: np.ndarray
    episode_signal: np.ndarray


def basis(inputs: StepRows, common: CommonOptions) -> Basis:
    """The :class:`Basis` of a batch; ``inputs.row_penalty`` (N,) needs ``episode_stats='step'``."""
    gamma, norm, epsilon, episode_stats = common.gamma, common.norm, common.epsilon, common.episode_stats
    row_penalty = inputs.row_penalty
    rows = prepare_rows(inputs)
    if row_penalty is not None and episode_stats != "step":
        raise ValueError(
            f"row_penalty needs episode_stats='step', got {episode_stats!r}: with a penalty on its own rows a "
            "trajectory has no single episode score, so the episode term is taken over step rows (as the reference "
            "implementation does)"
        )
    penalty = np.zeros(rows.m) if row_penalty is None else as_row_penalty(row_penalty, rows.n)[rows.rows]  # (M,)
    s_group, num_s = anchor_groups(rows, common.similarity_threshold)  # (M,)
    with np.errstate(over="ignore", invalid="ignore"):
        R_t, R_traj = step_returns(rows, gamma)  # (M,), (T,)
        R_t = R_t - penalty  # (M,)
        R_row = R_traj[rows.t] - penalty  # (M,)
        A_E, flat_groups = episode_advantage(rows, R_traj, norm, epsilon, episode_stats, row_scores=R_row)
        x, codes, _ = _episode_samples(rows, R_traj, episode_stats, R_row)
        episode_signal = differs_in_groups(x, codes, rows.num_groups)[rows.g]  # (M,)
    return Basis(rows, s_group, num_s, R_t, R_traj, R_row, penalty, A_E, flat_groups, episode_signal)


def step_returns(rows: ValidRows, gamma: float) -> tuple[np.ndarray, np.ndarray]:
    """``R_t = r_t + gamma R_{t+1}`` in step order (M,) and ``R(tau) = sum_t r_t`` (T,)."""
    R_t = np.empty_like(rows.r)  # (M,)
    R_t[rows.order] = discounted_step_returns(rows.r[rows.order], rows.t[rows.order], gamma)
    R_traj = np.bincount(rows.t, weights=rows.r, minlength=rows.num_trajs)  # (T,)
    return R_t, R_traj


def episode_advantage(
    rows: ValidRows,
    R_traj: np.ndarray,
    norm: str,
    epsilon: float,
    episode_stats: str,
    *,
    row_scores: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """A_E (M,): R(tau) normalised within its episode group (GiGPO Eq. 3), and ``flat`` (G,) equal-score groups.

    Over trajectories or, with ``episode_stats="step"``, over step rows scoring ``row_scores`` (M,) when given.
    """
    x, codes, to_rows = _episode_samples(rows, R_traj, episode_stats, row_scores)
    adv, _, flat = normalise_in_groups(x, codes, rows.num_groups, norm, epsilon)  # (T,) or (M,)
    return adv[to_rows], flat


def episode_at_mean(
    rows: ValidRows, R_traj: np.ndarray, episode_stats: str, *, row_scores: np.ndarray | None = None
) -> np.ndarray:
    """(M,) bool: the row's episode score is its group's mean (:func:`at_group_mean`)."""
    x, codes, to_rows = _episode_samples(rows, R_traj, episode_stats, row_scores)
    return at_group_mean(x, codes, rows.num_groups)[to_rows]


def _episode_samples(
    rows: ValidRows, R_traj: np.ndarray, episode_stats: str, row_scores: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(values, group codes, index of each row's value) the episode statistics run over."""
    if episode_stats == "trajectory":
        return R_traj, rows.traj_group, rows.t
    return (R_traj[rows.t] if row_scores is None else row_scores), rows.g, np.arange(rows.m)


AT_MEAN_RTOL = 1e-12
"""A value x counts as its group's mean m when ``|x - m| <= AT_MEAN_RTOL * max(1, |m|)`` (:func:`at_group_mean`)."""


def group_means(x: np.ndarray, codes: np.ndarray, num_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """``(mean (G,), size (G,))`` of ``x`` (n,) within groups ``codes`` (n,); 0 for an empty group."""
    size = np.bincount(codes, minlength=num_groups)  # (G,)
    return np.bincount(codes, weights=x, minlength=num_groups) / np.maximum(size, 1), size


def at_group_mean(x: np.ndarray, codes: np.ndarray, num_groups: int) -> np.ndarray:
    """(n,) bool: ``|x - mean| <= 1e-12 * max(1, |mean|)``, decided before any division."""
    mean, _ = group_means(x, codes, num_groups)
    m = mean[codes]  # (n,)
    return np.abs(x - m) <= AT_MEAN_RTOL * np.maximum(1.0, np.abs(m))


SIGNAL_RTOL = 4 * float(np.finfo(np.float32).eps)
"""Relative tolerance of :func:`differs_in_groups` (4.8e-7: four float32 ulps of the group's largest value)."""

SIGNAL_ATOL = 1e-9
"""Absolute tolerance of :func:`differs_in_groups` (values near 0)."""


def differs_in_groups(x: np.ndarray, codes: np.ndarray, num_groups: int) -> np.ndarray:
    """(G,) bool: ``max - min > SIGNAL_RTOL * max |x| + SIGNAL_ATOL`` within each group of ``x`` (n,)."""
    hi = np.full(num_groups, -np.inf)
    lo = np.full(num_groups, np.inf)
    np.maximum.at(hi, codes, x)
    np.minimum.at(lo, codes, x)
    with np.errstate(invalid="ignore", over="ignore"):  # empty groups: -inf - inf, False below
        scale = np.maximum(np.abs(hi), np.abs(lo))  # (G,)
        return hi - lo > SIGNAL_RTOL * scale + SIGNAL_ATOL


def normalise_in_groups(
    x: np.ndarray, codes: np.ndarray, num_groups: int, norm: str, epsilon: float, *, ddof: int = 1
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(x - mean) / (std + eps)`` or ``x - mean`` within groups; std over ``size - ddof``.

    ``x``, ``codes``: (n,). Returns ``(adv (n,), size (G,), flat (G,))``; flat (all-equal) groups get exactly 0.
    """
    mean, size = group_means(x, codes, num_groups)  # (G,), (G,)
    hi = np.full(num_groups, -np.inf)
    lo = np.full(num_groups, np.inf)
    np.maximum.at(hi, codes, x)
    np.minimum.at(lo, codes, x)
    flat = hi == lo  # (G,)
    centered = x - mean[codes]  # (n,)
    centered[flat[codes]] = 0.0  # no 1-ulp residue of the mean in constant groups
    if norm == "mean":
        return centered, size, flat
    sq = np.bincount(codes, weights=centered * centered, minlength=num_groups)  # (G,)
    std = np.sqrt(sq / np.maximum(size - ddof, 1))  # (G,)
    return centered / (std[codes] + epsilon), size, flat


def discounted_step_returns(rewards: np.ndarray, segments: np.ndarray, gamma: float) -> np.ndarray:
    """Segmented discounted return-to-go ``R_i = r_i + gamma * R_{i+1}`` within each run of ``segments``.

    ``rewards``, ``segments``: (M,), time-ordered, each segment contiguous. Returns (M,) float64 (a doubling scan).
    """
    acc = np.asarray(rewards, dtype=np.float64).copy()  # (M,)
    m = acc.shape[0]
    if m == 0:
        return acc
    starts = np.flatnonzero(np.r_[True, segments[1:] != segments[:-1]])  # (T,) first row of each segment
    lengths = np.diff(np.r_[starts, m])  # (T,)
    remaining = np.repeat(starts + lengths, lengths) - np.arange(m)  # (M,) rows from i to its segment end
    d, gamma_d = 1, float(gamma)
    longest = int(lengths.max())
    while d < longest:
        acc[:-d] += np.where(remaining[:-d] > d, gamma_d, 0.0) * acc[d:]  # right side is built before the add
        d, gamma_d = 2 * d, gamma_d * gamma_d
    return acc


def check_overflow(rows: ValidRows, results: dict[str, np.ndarray]) -> None:
    """Raise when a result (M,) is not finite although every reward is (float64 overflow)."""
    for what, values in results.items():
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            i = int(rows.rows[bad[0]])
            raise ValueError(
                f"the {what} of row {i} overflows float64 ({show(values[bad[0]])}) although every reward is finite "
                f"(largest |reward| {float(np.abs(rows.r).max()):.3g}): sums, differences and squares of rewards "
                "must stay below ~1e154 in magnitude; scale the rewards down (e.g. to |r| <= 1e6)"
            )
