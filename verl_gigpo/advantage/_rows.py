"""Row helpers shared by every estimator of :mod:`verl_gigpo.advantage`: reading and checking the per-row inputs,
the trajectory structure of the valid rows (codes, step order, previous/next step), anchor groups, discounted
returns, the episode-level term and group statistics.

Ids are read and coded by :mod:`verl_gigpo._ids` (the module anchor grouping uses too).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from verl_gigpo._ids import as_id_array, id_codes, pair_codes, show
from verl_gigpo.anchors import anchor_group_ids, check_similarity_threshold

__all__ = [
    "EPISODE_STATS",
    "NORMS",
    "Basis",
    "MethodOptions",
    "StepRows",
    "anchor_groups",
    "as_flags",
    "as_response_mask",
    "basis",
    "check_common_options",
    "check_number",
    "check_overflow",
    "discounted_step_returns",
    "episode_advantage",
    "normalise_in_groups",
    "prepare_rows",
    "step_returns",
]

NORMS = ("mean_std", "mean")
"""Valid ``norm`` values: ``"mean_std"`` = (x - mean) / (std + eps); ``"mean"`` = x - mean."""

EPISODE_STATS = ("trajectory", "step")
"""Valid ``episode_stats`` values: statistics over trajectories (paper Eq. 3) or over step rows (reference)."""


# ---------------------------------------------------------------------------------------------------- options
def is_real(x: Any) -> bool:
    """A real number that is not a bool (True is not 1.0 here)."""
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


def check_common_options(*, gamma: Any, norm: Any, epsilon: Any, episode_stats: Any) -> dict[str, Any]:
    """The options every estimator shares: ``norm`` in :data:`NORMS`, ``episode_stats`` in :data:`EPISODE_STATS`,
    ``gamma`` a number in [0, 1], ``epsilon`` a finite number > 0. Returns them with numbers as floats.

    Raises:
        ValueError: naming the option, the value given and the valid values.
    """
    if norm not in NORMS:
        hints = {
            "mean_norm": " (the reference code's mode='mean_norm' meant 'mean')",
            "mean_std_norm": " (the reference code's 'mean_std_norm' is 'mean_std')",
        }
        hint = hints.get(norm, "") if isinstance(norm, str) else ""
        raise ValueError(
            f"norm={norm!r} is not a norm{hint}; use 'mean_std' (subtract the group mean, divide by std + epsilon) "
            "or 'mean' (only subtract the group mean)"
        )
    if episode_stats not in EPISODE_STATS:
        raise ValueError(
            f"episode_stats={episode_stats!r} is not valid; use 'trajectory' (each trajectory counts once, paper "
            "Eq. 3) or 'step' (every step row counts, as the reference code does)"
        )
    if not is_real(gamma) or not 0.0 <= gamma <= 1.0:
        raise ValueError(
            f"gamma={show(gamma)} must be a number in [0, 1] (the paper uses 0.95; 1.0 = no discount, 0 = each "
            "step's own reward)"
        )
    if not is_real(epsilon) or not 0.0 < epsilon < math.inf:
        raise ValueError(f"epsilon={show(epsilon)} must be a finite number > 0 (e.g. 1e-6)")
    return {"gamma": float(gamma), "norm": norm, "epsilon": float(epsilon), "episode_stats": episode_stats}


def check_number(
    key: str, value: Any, *, low: float, high: float = math.inf, low_open: bool = False, why: str
) -> float:
    """``value`` as a float when it is a real number in ``[low, high]`` (``(low, high]`` with ``low_open``); else
    ``ValueError("<key>=<value> must be ... (<why>)")``. Infinity and NaN are never valid."""
    ok = is_real(value) and math.isfinite(value) and (value > low if low_open else value >= low) and value <= high
    if not ok:
        lower = f"> {low:g}" if low_open else f">= {low:g}"
        span = (
            f"a finite number {lower}"
            if high == math.inf
            else f"a number in {'(' if low_open else '['}{low:g}, {high:g}]"
        )
        raise ValueError(f"{key}={show(value)} must be {span} ({why})")
    return float(value)


class MethodOptions:
    """Base of a successor's frozen options dataclass (:class:`~verl_gigpo.advantage.HGPOOptions`, ...): at
    construction every field goes through the method's check, ``_check`` (a ``staticmethod`` taking the fields as
    keywords and returning them validated, numbers as floats)."""

    _check: Any = None

    def __post_init__(self) -> None:
        for key, value in type(self)._check(**self.kwargs()).items():
            object.__setattr__(self, key, value)  # frozen: the validated value replaces the given one

    def kwargs(self) -> dict[str, Any]:
        """The options as the keyword arguments of the method's terms function."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


# ---------------------------------------------------------------------------------------------------- inputs
def as_rewards(step_rewards: Any) -> np.ndarray:
    """``step_rewards`` as a ``(N,)`` float64 array (tensor or array-like; complex and multi-dimensional refused)."""
    if isinstance(step_rewards, torch.Tensor):
        if step_rewards.is_complex():
            raise ValueError("step_rewards must be a real tensor, got a complex one")
        arr = step_rewards.detach().to(device="cpu", dtype=torch.float64).numpy()
    else:
        try:
            arr = np.asarray(step_rewards, dtype=np.float64)
        except (TypeError, ValueError) as err:
            raise ValueError(f"step_rewards must be a (N,) float tensor; could not convert it: {err}") from err
    if arr.ndim != 1:
        raise ValueError(
            f"step_rewards must be 1-D (N,), one reward per step row; got shape {tuple(arr.shape)} "
            "(sum or squeeze token-level rewards first)"
        )
    return arr


def as_response_mask(response_mask: Any, n: int) -> torch.Tensor:
    """``response_mask`` as a 2-D ``(N, L)`` tensor with one row per step row."""
    mask = response_mask if isinstance(response_mask, torch.Tensor) else torch.as_tensor(np.asarray(response_mask))
    if mask.dim() != 2:
        raise ValueError(f"response_mask must be 2-D (N, L); got shape {tuple(mask.shape)}")
    if mask.shape[0] != n:
        raise ValueError(
            f"length mismatch: response_mask has {mask.shape[0]} rows but step_rewards has {n}; "
            "pass one row per step row"
        )
    return mask


def as_row_mask(row_mask: Any, n: int) -> np.ndarray:
    """``row_mask`` as a ``(N,)`` bool array (all True when None); only bool dtypes are accepted."""
    if row_mask is None:
        return np.ones(n, dtype=bool)
    if isinstance(row_mask, torch.Tensor):
        if row_mask.dtype != torch.bool:
            raise ValueError(f"row_mask must be a bool tensor/array, got dtype {row_mask.dtype}; use mask.bool()")
        arr = row_mask.detach().cpu().numpy()
    elif isinstance(row_mask, np.ndarray):
        if row_mask.dtype != np.bool_:
            raise ValueError(
                f"row_mask must be a bool array, got dtype {row_mask.dtype}; use row_mask.astype(bool) "
                "(True = real row, False = padding/duplicate)"
            )
        arr = row_mask
    else:
        raise ValueError(f"row_mask must be a bool np.ndarray or torch.Tensor of shape (N,), got {type(row_mask)}")
    if arr.shape != (n,):
        raise ValueError(f"row_mask must have shape ({n},) like step_rewards; got shape {tuple(arr.shape)}")
    return arr.copy()


def as_flags(values: Any, name: str, n: int, *, needed_by: str) -> np.ndarray:
    """A per-row flag (``won``, ``action_valid``) as a ``(N,)`` bool array: booleans, or numbers that are 0 or 1.

    Raises:
        ValueError: None (``needed_by`` says which estimator needs it), another length, or other values.
    """
    if values is None:
        raise ValueError(f"{needed_by} needs {name}: one bool per step row ({name}[i] of the row's trajectory step)")
    arr = as_id_array(values, name, n)
    if arr.dtype == np.bool_:
        return arr.astype(bool, copy=True)
    items = arr.tolist()
    bad = [i for i, v in enumerate(items) if v not in (0, 1)]  # NaN, None and text are none of them
    if bad:
        i = bad[0]
        raise ValueError(f"{name}[{i}] = {show(arr[i])} is not a bool; {name} holds True/False (or 1/0) per row")
    return np.fromiter((bool(v) for v in items), dtype=bool, count=n)


def _as_step_ids(steps: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Step ids as int64, exactly: integers, or floats / objects holding whole numbers, all within int64 (a
    uint64 or float id >= 2^63 would wrap negative and silently reverse the step order)."""
    kind = steps.dtype.kind
    limit = 2**63
    if kind == "i":
        return steps.astype(np.int64, copy=False)
    if kind == "u":
        big = np.flatnonzero(steps >= np.uint64(limit)) if steps.dtype.itemsize == 8 else np.zeros(0, np.int64)
        if big.size:
            _raise_step_range(steps, rows, int(big[0]))
        return steps.astype(np.int64)
    if kind not in "fO":
        raise ValueError(f"step_ids must be integers, got dtype {steps.dtype}; pass an integer array")
    if kind == "O" and all(isinstance(v, int | np.integer) and not isinstance(v, bool) for v in steps.tolist()):
        big = [k for k, v in enumerate(steps.tolist()) if not -limit <= int(v) < limit]
        if big:
            _raise_step_range(steps, rows, big[0])
        return steps.astype(np.int64)  # exact for Python ints (no detour through float64)
    try:
        f = steps.astype(np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"step_ids must be integers; could not read them as numbers: {err}") from err
    bad = np.flatnonzero(~np.isfinite(f) | (f != np.round(f)))
    if bad.size:
        i = int(rows[bad[0]])
        raise ValueError(f"step_ids must be integers; step_ids[{i}] = {show(steps[bad[0]])} is not a whole number")
    big = np.flatnonzero((f >= float(limit)) | (f < -float(limit)))
    if big.size:
        _raise_step_range(steps, rows, int(big[0]))
    return f.astype(np.int64)


def _raise_step_range(steps: np.ndarray, rows: np.ndarray, k: int) -> None:
    raise ValueError(
        f"step_ids[{int(rows[k])}] = {show(steps[k])} is outside the int64 range [-2^63, 2^63); step ids number "
        "the steps of a trajectory (0, 1, 2, ...): pass the step index, not a timestamp or a hash"
    )


# ---------------------------------------------------------------------------------------------------- rows
@dataclass(frozen=True)
class StepRows:
    """The valid rows of a batch and their trajectory structure (M valid rows of N, T trajectories, G groups).

    Attributes:
        n: batch rows N. valid: ``(N,)`` bool, rows that take part. rows: ``(M,)`` batch position of each valid row.
        r: ``(M,)`` float64 step rewards. steps: ``(M,)`` int64 step ids.
        t: ``(M,)`` trajectory code in ``[0, T)``; traj_group: ``(T,)`` episode group code of each trajectory;
            g: ``(M,)`` episode group code in ``[0, G)``; num_trajs T, num_groups G.
        order: ``(M,)`` permutation sorting the valid rows by (trajectory, step id).
        pos: ``(M,)`` 0-based position of the row in its trajectory (step-id order: ids 0, 2, 5 are positions
            0, 1, 2); traj_len: ``(T,)`` rows per trajectory.
        prev, next: ``(M,)`` the valid-row index of the previous / next step of the same trajectory, -1 at its
            start / end.
        traj_ids, anchor_keys: ``(N,)`` the inputs as given (for messages and anchor grouping).
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
        """``(M,)`` values of the valid rows into a ``(N,)`` array, ``fill`` on the other rows."""
        out = np.full(self.n, fill, dtype=dtype)
        out[self.rows] = x
        return out

    def per_trajectory(self, flags: np.ndarray, name: str) -> np.ndarray:
        """A ``(N,)`` bool flag that must be equal on every row of a trajectory (``won``), as ``(T,)``.

        Raises:
            ValueError: a trajectory whose valid rows disagree, naming it and two of its rows.
        """
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


def prepare_rows(
    step_rewards: Any,
    response_mask: Any,
    group_ids: Any,
    traj_ids: Any,
    step_ids: Any,
    anchor_keys: Any,
    row_mask: Any = None,
) -> StepRows:
    """Read and check the per-row inputs (see :func:`verl_gigpo.advantage.gigpo_advantage_terms`) and work out
    the trajectory structure of the valid rows.

    Raises:
        ValueError: length mismatches; non-finite rewards among valid rows; bad step ids; a trajectory in two
            episode groups; duplicate (traj id, step id) among valid rows; missing or unhashable ids.
    """
    rewards = as_rewards(step_rewards)  # (N,) float64
    n = rewards.shape[0]
    as_response_mask(response_mask, n)
    valid = as_row_mask(row_mask, n)  # (N,) bool
    groups = as_id_array(group_ids, "group_ids", n)
    trajs = as_id_array(traj_ids, "traj_ids", n)
    anchors = as_id_array(anchor_keys, "anchor_keys", n)
    steps_raw = as_id_array(step_ids, "step_ids", n)
    rows = np.flatnonzero(valid)  # (M,) positions of the valid rows
    r = rewards[rows]  # (M,)
    bad = np.flatnonzero(~np.isfinite(r))
    if bad.size:
        i = int(rows[bad[0]])
        raise ValueError(
            f"step_rewards[{i}] = {show(rewards[i])} is not finite ({bad.size} non-finite reward(s) among valid rows; "
            f"first bad row {i}): fix the reward source, or mark the row with row_mask=False to ignore it"
        )
    steps = _as_step_ids(steps_raw[rows], rows)  # (M,) int64
    t, traj_group = _trajectory_codes(rows, trajs, groups)
    order, pos, prev, nxt = _step_order(rows, t, steps, trajs, steps_raw)
    return StepRows(
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
    """Trajectory codes ``(M,)`` of the valid rows and the episode group code ``(T,)`` of each trajectory; every
    row of a trajectory must carry its group id."""
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
    """The permutation sorting the valid rows by (trajectory, step id), each row's position in its trajectory, and
    its previous / next step (-1 at the ends), all ``(M,)``. Duplicate (traj id, step id) pairs are an error."""
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


def anchor_groups(rows: StepRows, similarity_threshold: float | None) -> tuple[np.ndarray, int]:
    """The anchor group (episode group, anchor key) of each valid row, ``(M,)`` codes numbered by first appearance,
    and their number. With a ``similarity_threshold`` t < 1 the keys (str observation texts) are first merged by
    :func:`verl_gigpo.anchors.anchor_group_ids` within each episode group.

    Raises:
        ValueError: missing or unhashable keys; with t < 1, a key that is not a str.
    """
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
    """What every estimator computes the same way from a batch (M valid rows, S anchor groups, T trajectories,
    G episode groups): the rows, their anchor groups ``s_group`` ``(M,)`` (``num_s`` of them), R_t ``(M,)``, the
    episode returns ``R_traj`` ``(T,)``, the episode term ``A_E`` ``(M,)`` and the episode groups whose returns are
    all equal, ``flat_groups`` ``(G,)``."""

    rows: StepRows
    s_group: np.ndarray
    num_s: int
    R_t: np.ndarray
    R_traj: np.ndarray
    A_E: np.ndarray
    flat_groups: np.ndarray


def basis(
    step_rewards: Any,
    response_mask: Any,
    group_ids: Any,
    traj_ids: Any,
    step_ids: Any,
    anchor_keys: Any,
    *,
    row_mask: Any,
    gamma: float,
    norm: str,
    epsilon: float,
    episode_stats: str,
    similarity_threshold: float | None,
) -> Basis:
    """The :class:`Basis` of a batch (options already checked): :func:`prepare_rows`, :func:`anchor_groups`,
    :func:`step_returns` and :func:`episode_advantage`. Overflow is left to :func:`check_overflow`."""
    rows = prepare_rows(step_rewards, response_mask, group_ids, traj_ids, step_ids, anchor_keys, row_mask)
    s_group, num_s = anchor_groups(rows, similarity_threshold)  # (M,)
    with np.errstate(over="ignore", invalid="ignore"):
        R_t, R_traj = step_returns(rows, gamma)  # (M,), (T,)
        A_E, flat_groups = episode_advantage(rows, R_traj, norm, epsilon, episode_stats)  # (M,), (G,)
    return Basis(rows, s_group, num_s, R_t, R_traj, A_E, flat_groups)


def step_returns(rows: StepRows, gamma: float) -> tuple[np.ndarray, np.ndarray]:
    """``R_t = r_t + gamma R_{t+1}`` along each trajectory in step order ``(M,)``, and the episode return
    ``R(tau) = sum_t r_t`` of each trajectory ``(T,)``."""
    R_t = np.empty_like(rows.r)  # (M,)
    R_t[rows.order] = discounted_step_returns(rows.r[rows.order], rows.t[rows.order], gamma)
    R_traj = np.bincount(rows.t, weights=rows.r, minlength=rows.num_trajs)  # (T,)
    return R_t, R_traj


def episode_advantage(
    rows: StepRows, R_traj: np.ndarray, norm: str, epsilon: float, episode_stats: str
) -> tuple[np.ndarray, np.ndarray]:
    """The episode-level relative advantage (GiGPO paper Eq. 3): ``R(tau)`` normalised within its episode group,
    over trajectories (``episode_stats="trajectory"``) or over step rows (``"step"``).

    Returns:
        ``(A_E (M,), flat (G,))``: ``flat`` marks episode groups whose returns are all equal (their A_E is 0).
    """
    if episode_stats == "trajectory":
        adv_traj, _, flat = normalise_in_groups(R_traj, rows.traj_group, rows.num_groups, norm, epsilon)  # (T,)
        return adv_traj[rows.t], flat
    A_E, _, flat = normalise_in_groups(R_traj[rows.t], rows.g, rows.num_groups, norm, epsilon)  # (M,)
    return A_E, flat


def normalise_in_groups(
    x: np.ndarray, codes: np.ndarray, num_groups: int, norm: str, epsilon: float, *, ddof: int = 1
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Normalise ``x`` ``(n,)`` within groups ``codes`` ``(n,)``: ``(x - mean) / (std + eps)`` or ``x - mean``, with
    ``std = sqrt(sum (x - mean)^2 / (size - ddof))`` (ddof 1: unbiased, 0: population).

    Returns ``(adv (n,), size (G,), flat (G,))``; ``flat`` marks groups whose members are all equal (singletons
    included), which get exactly 0.
    """
    size = np.bincount(codes, minlength=num_groups)  # (G,)
    mean = np.bincount(codes, weights=x, minlength=num_groups) / np.maximum(size, 1)  # (G,)
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
    """Segmented discounted return-to-go: ``R_i = r_i + gamma * R_{i+1}`` inside each run of equal ``segments``.

    Rows must already be in time order within each segment, and each segment must be contiguous.

    Computed by a doubling (Hillis-Steele) scan over contiguous shifts: with ``d = 2^k``, after pass k
    ``acc[i] = sum_{j=i}^{min(i+2d, e)-1} gamma^(j-i) r_j`` (e = end of i's segment), obtained as
    ``acc[i] += gamma^d * acc[i+d]`` where ``i + d < e``. ``ceil(log2 T_max)`` passes over the whole array
    (T_max = longest segment): O(M log T_max) work in contiguous vector operations, about 0.1 s for one segment
    of 10^6 rows. Only non-negative powers of gamma appear (no ``gamma^-t`` rescaling), so it is stable for any
    length; a contribution is dropped only when its weight ``gamma^d`` underflows float64 (below ~1e-308).

    Args:
        rewards: ``(M,)`` float array.
        segments: ``(M,)`` array of segment labels (e.g. trajectory codes), contiguous runs.
        gamma: discount factor.

    Returns:
        ``(M,)`` float64 array of discounted returns.
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


def check_overflow(rows: StepRows, results: dict[str, np.ndarray]) -> None:
    """Raise when a result is not finite although every reward is (float64 overflow); ``results`` in the order
    they are computed, each ``(M,)`` over the valid rows."""
    for what, values in results.items():
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            i = int(rows.rows[bad[0]])
            raise ValueError(
                f"the {what} of row {i} overflows float64 ({show(values[bad[0]])}) although every reward is finite "
                f"(largest |reward| {float(np.abs(rows.r).max()):.3g}): sums, differences and squares of rewards "
                "must stay below ~1e154 in magnitude; scale the rewards down (e.g. to |r| <= 1e6)"
            )
