"""GiGPO advantage estimator (Group-in-Group Policy Optimization, Feng et al., arXiv 2505.10978).

Pure maths over tensors and id arrays: no verl types, no I/O, no prints.

Notation (one training row per environment step)::

    r_t                   reward of a step row (environment reward + shaping)
    R(tau)   = sum_t r_t                              episode return of trajectory tau
    R_t      = sum_{k >= t} gamma^(k - t) r_k         discounted step return ("R_t")
    A_E(tau) = (R(tau) - mean_G R) / (std_G R + eps)  episode-level relative advantage, G = episode group
    A_S(t)   = (R_t - mean_S R) / (std_S R + eps)     step-level relative advantage, S = anchor group
    A(t)     = A_E(tau) + w * A_S(t)                  combined advantage, broadcast over the response tokens

An episode group is the set of trajectories that start from the same task and initial state (verl's ``uid``).
An anchor group is the set of step rows of one episode group whose anchor key (a function of the environment
state) is equal: actions taken from the same state in different trajectories are compared with each other.

Equation numbers. Both the reference code and this project call the episode-level advantage Eq. 3 of the paper.
The later equations are numbered differently across versions of the paper: the reference code cites Eq. 5 for
R_t, Eq. 6 for anchor state grouping, Eq. 7 for the step-level advantage and Eq. 8 for the combination, while a
later version numbers anchor grouping 6-7, the step-level advantage 8 and the combination 9. We could not check
the PDF here, so below the names are primary and the numbers are given as "see paper".

Deliberate deviations from the reference implementation (verl-agent, ``gigpo/core_gigpo.py``):

1. Episode statistics over trajectories by default (``episode_stats="trajectory"``): each trajectory counts once
   in its group's mean and std, as in Eq. 3. The reference counts every step row, so long trajectories weigh
   more; that behaviour is available as ``episode_stats="step"``.
2. Padding and duplicate rows (``row_mask`` False) take part in no statistic and get advantage 0. The reference
   counts verl's padding rows (deep copies of real rows) in group statistics.
3. Step returns are accumulated in step-id order, never in batch order: a shuffled batch gives the same R_t.
4. A group with a single member gets 0 at both levels. The reference gives a lone trajectory its raw episode
   return (mean 0, std 1) at the episode level.
5. The std is the unbiased one (N - 1), written out explicitly; the option names say what they do:
   ``norm="mean_std" | "mean"`` (the reference's ``mode="mean_norm"`` meant "do not divide by the std").
6. One reward signal: the episode return is the sum of the same step rewards that give R_t (the reference reads
   the episode score from a separate token-level reward tensor).
7. Vectorised: hash factorisation of the ids (O(N)), one O(N log N) sort by (trajectory, step id) and an
   O(N log T_max) segmented scan for R_t; no Python loop over rows and no O(N^2) ``np.where`` per group.
8. Group ids come from the ids passed in, never from positions (``i % n``) or ``uuid4`` inside the maths; the
   result depends only on ids and values, so permuting the batch permutes the output.
9. Diagnostics are returned as floats (:class:`GiGPOTerms` ``.stats``), never printed.
10. The second output is the discounted step return R_t (the reference returns the advantages twice).
11. Inputs are validated; bad input raises ``ValueError`` saying what is wrong and what to do.
12. Similarity grouping of free-text anchors (see :mod:`verl_gigpo.anchors`) is order-independent connected
    components of a documented similarity, not greedy first-fit clustering against a cluster representative. It is
    an option of the estimator itself (``similarity_threshold``), which
    :meth:`verl_gigpo.config.GiGPOConfig.advantage_terms` sets for ``key_mode="similarity"`` in every caller.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch

from verl_gigpo.anchors import anchor_group_ids, check_similarity_threshold

__all__ = [
    "EPISODE_STATS",
    "NORMS",
    "STAT_NAMES",
    "GiGPOTerms",
    "check_estimator_options",
    "compute_gigpo_advantage",
    "discounted_step_returns",
    "gigpo_advantage_terms",
]

logger = logging.getLogger(__name__)

NORMS = ("mean_std", "mean")
"""Valid ``norm`` values: ``"mean_std"`` = (x - mean) / (std + eps); ``"mean"`` = x - mean."""

EPISODE_STATS = ("trajectory", "step")
"""Valid ``episode_stats`` values: statistics over trajectories (paper Eq. 3) or over step rows (reference)."""

_NUMPY_MASK_DTYPES = (
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.float32,
    torch.float64,
)

STAT_NAMES = (
    "gigpo/num_episode_groups",
    "gigpo/num_step_groups",
    "gigpo/step_group_size_mean",
    "gigpo/step_group_size_max",
    "gigpo/frac_singleton_step_groups",
    "gigpo/frac_rows_in_singleton_step_groups",
    "gigpo/frac_zero_std_episode_groups",
    "gigpo/episode_adv_abs_mean",
    "gigpo/step_adv_abs_mean",
    "gigpo/num_masked_rows",
)
"""Names of the diagnostics in :attr:`GiGPOTerms.stats` (documented in :func:`gigpo_advantage_terms`)."""


@dataclass(frozen=True)
class GiGPOTerms:
    """Per-row terms of the GiGPO advantage, plus batch diagnostics.

    All arrays have shape ``(N,)``, one entry per input row; rows with ``row_mask`` False hold 0 everywhere.

    Attributes:
        episode_return: float64, R(tau) = sum of the trajectory's valid step rewards (same for all its rows).
        step_return: float64, R_t = sum_{k >= t} gamma^(k - t) r_k along the trajectory in step-id order.
        episode_adv: float64, A_E: R(tau) normalised within its episode group.
        step_adv: float64, A_S: R_t normalised within its anchor group (episode group, anchor key).
        advantage: float64, A = A_E + step_advantage_w * A_S.
        anchor_group: int64, the anchor group (episode group, anchor key) the row's A_S was computed in, numbered
            0, 1, ... in order of first appearance among valid rows (-1 for masked rows).
        anchor_group_size: int64, number of valid rows in the row's anchor group (0 for masked rows).
        row_mask: bool, which rows took part (True) and which were ignored (False).
        stats: diagnostics as plain floats, keys :data:`STAT_NAMES` (see :func:`gigpo_advantage_terms`).
    """

    episode_return: np.ndarray
    step_return: np.ndarray
    episode_adv: np.ndarray
    step_adv: np.ndarray
    advantage: np.ndarray
    anchor_group: np.ndarray
    anchor_group_size: np.ndarray
    row_mask: np.ndarray
    stats: dict[str, float] = field(default_factory=dict)

    def token_level(self, response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Broadcast the per-row advantage and step return over the response tokens.

        Args:
            response_mask: ``(N, L)`` tensor (bool, int or float); its device is the output device.

        Returns:
            ``(advantages, returns)``, both float32 ``(N, L)``: ``A[:, None] * mask`` and ``R_t[:, None] * mask``.

        Raises:
            ValueError: a non-finite ``response_mask`` entry (NaN would pass into the loss), or an advantage or
                step return too large for float32 (|x| > 3.4e38).
        """
        mask = _as_response_mask(response_mask, self.advantage.shape[0]).detach()  # (N, L)
        for name, values in (("advantage", self.advantage), ("step return R_t", self.step_return)):
            too_big = np.flatnonzero(np.abs(values) > np.finfo(np.float32).max)
            if too_big.size:
                i = int(too_big[0])
                raise ValueError(
                    f"the {name} of row {i} ({values[i]:.3g}) does not fit the float32 output (|x| <= 3.4e38); scale "
                    "the rewards down (e.g. to |r| <= 1e6)"
                )
        adv = self.advantage.astype(np.float32)[:, None]  # (N, 1)
        ret = self.step_return.astype(np.float32)[:, None]  # (N, 1)
        if mask.device.type == "cpu" and mask.dtype in _NUMPY_MASK_DTYPES:
            # numpy on CPU: single-threaded, so no thread-pool hand-off on a busy machine; same numbers.
            with np.errstate(over="ignore"):  # a float64 value beyond float32 becomes inf: reported below
                m = mask.numpy().astype(np.float32, copy=False)
            if mask.is_floating_point() and not np.isfinite(m).all():
                _raise_mask(mask, np.argwhere(~np.isfinite(m))[0])
            return torch.from_numpy(adv * m), torch.from_numpy(ret * m)  # (N, L), (N, L)
        mask = mask.to(torch.float32)
        if not bool(torch.isfinite(mask).all()):
            _raise_mask(response_mask, torch.nonzero(~torch.isfinite(mask))[0].tolist())
        return torch.from_numpy(adv).to(mask.device) * mask, torch.from_numpy(ret).to(mask.device) * mask


@torch.no_grad()
def compute_gigpo_advantage(
    step_rewards,
    response_mask,
    group_ids,
    traj_ids,
    step_ids,
    anchor_keys,
    *,
    row_mask=None,
    gamma=0.95,
    step_advantage_w=1.0,
    norm="mean_std",
    epsilon=1e-6,
    episode_stats="trajectory",
    similarity_threshold=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GiGPO advantages and discounted step returns, broadcast over the response tokens.

    ``A = A_E + step_advantage_w * A_S`` (combined advantage; see paper), where ``A_E`` is the episode-level
    relative advantage (paper Eq. 3) and ``A_S`` the step-level relative advantage over anchor groups (see
    paper). The exact definitions, the handling of padding rows and every argument are documented in
    :func:`gigpo_advantage_terms`, which this function calls; use that function directly to also get the
    per-row terms and the ``gigpo/*`` diagnostics.

    Args:
        step_rewards: ``(N,)`` float tensor, the reward of each step row (environment reward + shaping).
        response_mask: ``(N, L)`` tensor, 1 on response tokens.
        group_ids: ``(N,)`` array of hashables, episode group (same task, same initial state).
        traj_ids: ``(N,)`` array of hashables, trajectory id.
        step_ids: ``(N,)`` integer array, step index inside the trajectory.
        anchor_keys: ``(N,)`` array of hashables (str / int / tuple), the anchor state of each step.
        row_mask: optional ``(N,)`` bool array or tensor; False marks padding/duplicate rows.
        gamma: discount in [0, 1] for R_t (0: R_t = r_t).
        step_advantage_w: weight w >= 0 of the step-level term.
        (The options are checked by :func:`check_estimator_options`, as ``GiGPOConfig`` does.)
        norm: ``"mean_std"`` or ``"mean"``.
        epsilon: > 0, added to the std.
        episode_stats: ``"trajectory"`` (paper) or ``"step"`` (reference code).
        similarity_threshold: None or 1.0: anchor keys match when equal; a number in (0, 1): str anchor keys
            (observation texts) match when :func:`verl_gigpo.anchors.anchor_group_ids` puts them in one group at
            this threshold, within each episode group (``GiGPOConfig(key_mode="similarity")``).

    Returns:
        ``(advantages, returns)``: float32 ``(N, L)`` tensors on ``response_mask``'s device, both multiplied by
        ``response_mask``; ``returns`` holds R_t.

    Raises:
        ValueError: on malformed input (see :func:`gigpo_advantage_terms`).
    """
    terms = gigpo_advantage_terms(
        step_rewards,
        response_mask,
        group_ids,
        traj_ids,
        step_ids,
        anchor_keys,
        row_mask=row_mask,
        gamma=gamma,
        step_advantage_w=step_advantage_w,
        norm=norm,
        epsilon=epsilon,
        episode_stats=episode_stats,
        similarity_threshold=similarity_threshold,
    )
    return terms.token_level(response_mask)


@torch.no_grad()
def gigpo_advantage_terms(
    step_rewards,
    response_mask,
    group_ids,
    traj_ids,
    step_ids,
    anchor_keys,
    *,
    row_mask=None,
    gamma=0.95,
    step_advantage_w=1.0,
    norm="mean_std",
    epsilon=1e-6,
    episode_stats="trajectory",
    similarity_threshold=None,
) -> GiGPOTerms:
    """Per-row GiGPO terms and diagnostics (the work behind :func:`compute_gigpo_advantage`).

    Only *valid* rows (``row_mask`` True; all rows when ``row_mask`` is None) are used; the others take part in
    no statistic and no validation of ids, and get 0 in every output. verl's padding rows are deep copies of
    real rows (same trajectory id, same step id), so they must be masked out here.

    Maths, over valid rows:

    * Episode return: ``R(tau) = sum_t r_t`` over the trajectory's rows; each row carries its trajectory's.
    * Step return: ``R_t = sum_{k >= t} gamma^(k - t) r_k``, i.e. ``R_t = r_t + gamma * R_{t+1}``, along the
      trajectory's rows sorted by ``step_ids``. Rows consecutive in step-id order are consecutive steps: ids
      ``0, 2, 5`` are treated as steps 0, 1, 2 (a gap in the ids does not add discounting). Computed in float64
      by a segmented doubling scan (``ceil(log2 T_max)`` vector passes, T_max = longest trajectory, see
      :func:`discounted_step_returns`) that only multiplies by powers of gamma <= 1: exact up to rounding for
      any length.
    * Episode-level relative advantage (paper Eq. 3), within each episode group G:
      ``A_E(tau) = (R(tau) - mean_G) / (std_G + epsilon)``. With ``episode_stats="trajectory"`` the mean and
      std are over the group's trajectories (each counts once); with ``"step"`` over its valid rows (each row
      contributes its trajectory's return, so longer trajectories weigh more, as in the reference code).
    * Anchor state grouping (see paper): the anchor group of a row is the pair (episode group, anchor key). With
      ``similarity_threshold`` t < 1 the key is first replaced by its similarity group among the valid rows of its
      episode group: the connected components of "identical texts, or shingle similarity >= t"
      (:func:`verl_gigpo.anchors.anchor_group_ids`; order-independent).
    * Step-level relative advantage (see paper), within each anchor group S:
      ``A_S(t) = (R_t - mean_S) / (std_S + epsilon)``.
    * Combined (see paper): ``A = A_E + step_advantage_w * A_S``.
    * ``norm="mean_std"`` uses ``std = sqrt(sum (x - mean)^2 / (n - 1))`` (unbiased); ``norm="mean"`` uses
      ``x - mean`` only (the paper's choice for WebShop). A group of one member, or one whose members are all
      equal, gets exactly 0.

    Args: as :func:`compute_gigpo_advantage`. Ids (``group_ids``, ``traj_ids``, ``anchor_keys``) may be ints,
        strings, or any hashable objects (tuples): pass a 1-D ``np.ndarray`` (``dtype=object`` for tuples, e.g.
        ``np.fromiter(keys, dtype=object, count=n)``); lists are converted. ``step_ids`` must hold integers
        (an integer dtype, or floats / objects whose values are whole numbers).

    Returns:
        :class:`GiGPOTerms` with per-row float64 terms and ``stats``:

        * ``gigpo/num_episode_groups``: distinct episode groups among valid rows.
        * ``gigpo/num_step_groups``: distinct anchor groups (episode group, anchor key) among valid rows.
        * ``gigpo/step_group_size_mean``: mean number of valid rows per anchor group.
        * ``gigpo/step_group_size_max``: size of the largest anchor group.
        * ``gigpo/frac_singleton_step_groups``: fraction of anchor groups with one row (their A_S is 0).
        * ``gigpo/frac_rows_in_singleton_step_groups``: fraction of valid rows that sit alone in their anchor
          group, i.e. get no step-level signal.
        * ``gigpo/frac_zero_std_episode_groups``: fraction of episode groups whose trajectories all have the
          same return (one-trajectory groups included), i.e. whose episode-level term is 0.
        * ``gigpo/episode_adv_abs_mean``: mean |A_E| over valid rows.
        * ``gigpo/step_adv_abs_mean``: mean |A_S| over valid rows.
        * ``gigpo/num_masked_rows``: rows with ``row_mask`` False (ignored).

        With no valid row every count and mean is 0.0.

    Raises:
        ValueError: length mismatches (naming the argument and both lengths); ``response_mask`` not 2-D;
            non-finite rewards (first bad row and value); rewards whose sums or squares overflow float64;
            invalid options (see :func:`check_estimator_options`); non-integer ``step_ids`` or ids outside
            int64; duplicate (traj id, step id) among valid
            rows; a trajectory in two episode groups; a ``row_mask`` that is not a bool ``(N,)`` array; missing
            (None/NaN) or unhashable ids; with ``similarity_threshold`` < 1, an anchor key that is not a str.
    """
    options = check_estimator_options(
        gamma=gamma,
        step_advantage_w=step_advantage_w,
        norm=norm,
        epsilon=epsilon,
        episode_stats=episode_stats,
        similarity_threshold=similarity_threshold,
    )
    rewards = _as_rewards(step_rewards)  # (N,) float64
    n = rewards.shape[0]
    _as_response_mask(response_mask, n)
    valid = _as_row_mask(row_mask, n)  # (N,) bool
    groups = _as_1d(group_ids, "group_ids", n)
    trajs = _as_1d(traj_ids, "traj_ids", n)
    anchors = _as_1d(anchor_keys, "anchor_keys", n)
    steps_raw = _as_1d(step_ids, "step_ids", n)

    rows = np.flatnonzero(valid)  # (M,) positions of the valid rows
    r = rewards[rows]  # (M,)
    bad = np.flatnonzero(~np.isfinite(r))
    if bad.size:
        i = int(rows[bad[0]])
        raise ValueError(
            f"step_rewards[{i}] = {_show(rewards[i])} is not finite ({bad.size} non-finite reward(s) among valid rows; "
            f"first bad row {i}): fix the reward source, or mark the row with row_mask=False to ignore it"
        )
    steps = _as_step_ids(steps_raw[rows], rows)  # (M,) int64
    t = _factorize(trajs[rows], "traj_ids", rows)  # (M,) trajectory codes in [0, T)
    num_trajs = int(t.max(initial=-1)) + 1
    rep = np.empty(num_trajs, dtype=np.int64)  # (T,) one valid row of each trajectory
    rep[t] = rows
    traj_group = _factorize(groups[rep], "group_ids", rep)  # (T,) episode group of each trajectory
    num_groups = int(traj_group.max(initial=-1)) + 1
    g = traj_group[t]  # (M,)
    # Each trajectory lies in exactly one episode group.
    row_groups = groups[rows]  # (M,)
    split = np.flatnonzero(~np.asarray(row_groups == groups[rep][t], dtype=bool))
    if split.size:
        k = int(split[0])
        i, j = int(rows[k]), int(rep[t[k]])
        if pd.isna(row_groups[k]):
            raise ValueError(f"group_ids[{i}] is missing ({_show(row_groups[k])}); every valid row needs an id")
        raise ValueError(
            f"trajectory traj_ids[{i}] = {_show(trajs[i])} appears in two episode groups: {_show(groups[i])} "
            f"(row {i}) and {_show(groups[j])} (row {j}); every row of a trajectory must carry the same group id"
        )
    if options["similarity_threshold"] in (None, 1.0):
        a = _factorize(anchors[rows], "anchor_keys", rows)  # (M,) anchor key codes
    else:
        a = _similarity_codes(anchors[rows], g, options["similarity_threshold"], rows)  # (M,) similarity groups

    # Order the valid rows by (trajectory, step id); duplicates become neighbours.
    order = _order_by_traj_step(t, steps)  # (M,)
    t_sorted, s_sorted = t[order], steps[order]
    dup = np.flatnonzero((t_sorted[1:] == t_sorted[:-1]) & (s_sorted[1:] == s_sorted[:-1]))
    if dup.size:
        i, j = sorted((int(rows[order[dup[0]]]), int(rows[order[dup[0] + 1]])))
        raise ValueError(
            f"duplicate (traj id, step id) among valid rows: rows {i} and {j} both have traj_ids = {_show(trajs[i])}, "
            f"step_ids = {int(steps_raw[i])}; each step of a trajectory must appear once (mark padding or "
            "duplicated copies with row_mask=False)"
        )

    # Finite rewards can still overflow float64 in a sum, a difference or a square (|r| near 1e308, or
    # |R| above ~1e154 for the std): computed quietly here, then every result is checked below.
    with np.errstate(over="ignore", invalid="ignore"):
        # Returns.
        R_t = np.empty_like(r)  # (M,)
        R_t[order] = discounted_step_returns(r[order], t_sorted, gamma)
        R_traj = np.bincount(t, weights=r, minlength=num_trajs)  # (T,) episode return of each trajectory

        # Episode-level relative advantage (paper Eq. 3).
        if episode_stats == "trajectory":
            adv_traj, _, flat_groups = _normalise_in_groups(R_traj, traj_group, num_groups, norm, epsilon)  # (T,)
            A_E = adv_traj[t]  # (M,)
        else:
            A_E, _, flat_groups = _normalise_in_groups(R_traj[t], g, num_groups, norm, epsilon)  # (M,)

        # Anchor groups = (episode group, anchor key); step-level relative advantage.
        s_group, s_uniques = pd.factorize(g * (int(a.max(initial=0)) + 1) + a)  # (M,)
        num_step_groups = len(s_uniques)
        A_S, s_size, _ = _normalise_in_groups(R_t, s_group, num_step_groups, norm, epsilon)  # (M,), (S,)

        A = A_E + step_advantage_w * A_S  # (M,)
    _check_overflow(rows, r, {"episode return": R_traj[t], "step return R_t": R_t, "advantage": A})

    def scatter(x: np.ndarray, dtype: Any = np.float64, fill: Any = 0) -> np.ndarray:
        out = np.full(n, fill, dtype=dtype)
        out[rows] = x
        return out

    m = rows.size
    singleton = s_size == 1
    stats = {
        "gigpo/num_episode_groups": float(num_groups),
        "gigpo/num_step_groups": float(num_step_groups),
        "gigpo/step_group_size_mean": float(m / num_step_groups) if num_step_groups else 0.0,
        "gigpo/step_group_size_max": float(s_size.max(initial=0)),
        "gigpo/frac_singleton_step_groups": float(singleton.mean()) if num_step_groups else 0.0,
        "gigpo/frac_rows_in_singleton_step_groups": float(singleton.sum() / m) if m else 0.0,
        "gigpo/frac_zero_std_episode_groups": float(flat_groups.mean()) if num_groups else 0.0,
        "gigpo/episode_adv_abs_mean": float(np.abs(A_E).mean()) if m else 0.0,
        "gigpo/step_adv_abs_mean": float(np.abs(A_S).mean()) if m else 0.0,
        "gigpo/num_masked_rows": float(n - m),
    }
    return GiGPOTerms(
        episode_return=scatter(R_traj[t]),
        step_return=scatter(R_t),
        episode_adv=scatter(A_E),
        step_adv=scatter(A_S),
        advantage=scatter(A),
        anchor_group=scatter(s_group, np.int64, fill=-1),
        anchor_group_size=scatter(s_size[s_group], np.int64),
        row_mask=valid,
        stats=stats,
    )


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


# ----------------------------------------------------------------------------------------------------------------
# helpers


def _normalise_in_groups(
    x: np.ndarray, codes: np.ndarray, num_groups: int, norm: str, epsilon: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Normalise ``x`` within groups ``codes``: ``(x - mean) / (std + eps)`` or ``x - mean``.

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
    std = np.sqrt(sq / np.maximum(size - 1, 1))  # (G,) unbiased
    return centered / (std[codes] + epsilon), size, flat


def _order_by_traj_step(t: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """Permutation sorting rows by (trajectory code, step id)."""
    if t.size == 0:
        return np.zeros(0, dtype=np.int64)
    lo, hi = int(steps.min()), int(steps.max())
    span = hi - lo + 1
    if (int(t.max()) + 1) * span < 2**62:  # one int64 key: faster than lexsort
        return np.argsort(t * span + (steps - lo))
    return np.lexsort((steps, t))


def check_estimator_options(
    *,
    gamma: Any,
    step_advantage_w: Any,
    norm: Any,
    epsilon: Any,
    episode_stats: Any,
    similarity_threshold: Any = None,
) -> dict[str, Any]:
    """Validate the estimator's options; the one check that both the estimator and ``GiGPOConfig`` use.

    Valid values: ``gamma`` a number in [0, 1] (0: R_t = r_t; 1: no discount), ``step_advantage_w`` a finite
    number >= 0 (0: the episode-level term alone), ``norm`` in :data:`NORMS`, ``epsilon`` a finite number > 0,
    ``episode_stats`` in :data:`EPISODE_STATS`, ``similarity_threshold`` None (exact keys) or a number in (0, 1]
    (:func:`verl_gigpo.anchors.check_similarity_threshold`). Booleans and strings are not numbers.

    Returns:
        the options as a dict, numbers as Python floats (the keyword arguments of :func:`compute_gigpo_advantage`).

    Raises:
        ValueError: naming the option, the value given and the valid values.
    """
    if norm not in NORMS:
        hint = (
            {
                "mean_norm": " (the reference code's mode='mean_norm' meant 'mean')",
                "mean_std_norm": " (the reference code's 'mean_std_norm' is 'mean_std')",
            }.get(norm, "")
            if isinstance(norm, str)
            else ""
        )
        raise ValueError(
            f"norm={norm!r} is not a norm{hint}; use 'mean_std' (subtract the group mean, divide by std + epsilon) "
            "or 'mean' (only subtract the group mean)"
        )
    if episode_stats not in EPISODE_STATS:
        raise ValueError(
            f"episode_stats={episode_stats!r} is not valid; use 'trajectory' (each trajectory counts once, paper "
            "Eq. 3) or 'step' (every step row counts, as the reference code does)"
        )
    if not _is_real(gamma) or not 0.0 <= gamma <= 1.0:
        raise ValueError(
            f"gamma={_show(gamma)} must be a number in [0, 1] (the paper uses 0.95; 1.0 = no discount, 0 = each "
            "step's own reward)"
        )
    if not _is_real(epsilon) or not 0.0 < epsilon < math.inf:
        raise ValueError(f"epsilon={_show(epsilon)} must be a finite number > 0 (e.g. 1e-6)")
    if not _is_real(step_advantage_w) or not 0.0 <= step_advantage_w < math.inf:
        raise ValueError(
            f"step_advantage_w={_show(step_advantage_w)} must be a finite number >= 0 (the paper uses 1.0; 0 turns "
            "the step-level term off)"
        )
    return {
        "gamma": float(gamma),
        "step_advantage_w": float(step_advantage_w),
        "norm": norm,
        "epsilon": float(epsilon),
        "episode_stats": episode_stats,
        "similarity_threshold": None
        if similarity_threshold is None
        else check_similarity_threshold(similarity_threshold),
    }


def _similarity_codes(texts: np.ndarray, groups: np.ndarray, threshold: float, rows: np.ndarray) -> np.ndarray:
    """Codes ``(M,)`` of the similarity groups of the valid rows' anchor texts within their episode group codes
    ``groups`` ``(M,)`` (:func:`verl_gigpo.anchors.anchor_group_ids`); ``rows`` maps back to batch rows for errors."""
    not_str = [k for k, v in enumerate(texts.tolist()) if not isinstance(v, str)]
    if not_str:
        k = not_str[0]
        raise ValueError(
            f"anchor_keys[{int(rows[k])}] = {_show(texts[k])} is a {type(texts[k]).__name__}; similarity grouping "
            f"(similarity_threshold={threshold}, GiGPOConfig key_mode='similarity') compares observation texts, so "
            "every valid row needs a str key: build the environment with key_mode='observation' "
            "(GiGPOConfig.env_key_mode), or use exact keys (similarity_threshold=None)"
        )
    return anchor_group_ids(texts, groups, threshold)  # (M,) int64, already distinct across episode groups


def _raise_mask(mask: Any, where: Any) -> None:
    i, j = (int(x) for x in where)
    raise ValueError(
        f"response_mask[{i}, {j}] = {float(mask[i, j])} is not finite (as float32); the mask must hold 1 on response "
        "tokens and 0 on padding (NaN or inf would pass into every loss term)"
    )


def _check_overflow(rows: np.ndarray, rewards: np.ndarray, results: dict[str, np.ndarray]) -> None:
    """Raise when a result is not finite although every reward is (float64 overflow); ``results`` in the order
    they are computed, each ``(M,)`` over the valid rows ``rows``."""
    for what, values in results.items():
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            i = int(rows[bad[0]])
            raise ValueError(
                f"the {what} of row {i} overflows float64 ({_show(values[bad[0]])}) although every reward is finite "
                f"(largest |reward| {float(np.abs(rewards).max()):.3g}): sums, differences and squares of rewards "
                "must stay below ~1e154 in magnitude; scale the rewards down (e.g. to |r| <= 1e6)"
            )


def _is_real(x: Any) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


def _as_rewards(step_rewards: Any) -> np.ndarray:
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


def _as_response_mask(response_mask: Any, n: int) -> torch.Tensor:
    mask = response_mask if isinstance(response_mask, torch.Tensor) else torch.as_tensor(np.asarray(response_mask))
    if mask.dim() != 2:
        raise ValueError(f"response_mask must be 2-D (N, L); got shape {tuple(mask.shape)}")
    if mask.shape[0] != n:
        raise ValueError(
            f"length mismatch: response_mask has {mask.shape[0]} rows but step_rewards has {n}; "
            "pass one row per step row"
        )
    return mask


def _as_row_mask(row_mask: Any, n: int) -> np.ndarray:
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


def _as_1d(values: Any, name: str, n: int) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        arr = values.detach().cpu().numpy()
    elif isinstance(values, np.ndarray):
        arr = values
    elif isinstance(values, Sequence) and not isinstance(values, (str, bytes)):
        arr = np.fromiter(values, dtype=object, count=len(values))  # keeps tuples whole
    else:
        raise ValueError(f"{name} must be a 1-D np.ndarray (N,), got {type(values).__name__}")
    if arr.ndim != 1:
        raise ValueError(
            f"{name} must be 1-D with one entry per row; got shape {arr.shape}. For tuple keys build an object "
            f"array: np.fromiter(keys, dtype=object, count=n)"
        )
    if arr.shape[0] != n:
        raise ValueError(f"length mismatch: {name} has {arr.shape[0]} entries but step_rewards has {n}")
    return arr


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
        raise ValueError(f"step_ids must be integers; step_ids[{i}] = {_show(steps[bad[0]])} is not a whole number")
    big = np.flatnonzero((f >= float(limit)) | (f < -float(limit)))
    if big.size:
        _raise_step_range(steps, rows, int(big[0]))
    return f.astype(np.int64)


def _raise_step_range(steps: np.ndarray, rows: np.ndarray, k: int) -> None:
    raise ValueError(
        f"step_ids[{int(rows[k])}] = {_show(steps[k])} is outside the int64 range [-2^63, 2^63); step ids number "
        "the steps of a trajectory (0, 1, 2, ...): pass the step index, not a timestamp or a hash"
    )


def _factorize(values: np.ndarray, name: str, rows: np.ndarray) -> np.ndarray:
    """Codes ``(M,)`` in ``[0, K)``, equal exactly where the values are equal (hash-based, O(M)).

    Object arrays go through Python's own (cached) ``hash`` and an integer factorisation, then every row is
    checked against its code's representative with ``==``; on any mismatch (a 64-bit hash collision, NaN) or
    a missing value (None) it falls back to ``pandas.factorize``, which is exact but slower on object arrays,
    and raises for missing or unhashable values.
    """
    if values.dtype == object and values.size:
        try:
            hashed = np.fromiter(map(hash, values), dtype=np.int64, count=values.shape[0])  # (M,)
        except TypeError:
            hashed = None  # an unhashable value: pandas below reports which
        if hashed is not None:
            codes, uniques = pd.factorize(hashed)
            rep = np.empty(len(uniques), dtype=np.int64)  # (K,) one row holding each code
            rep[codes] = np.arange(codes.shape[0])
            try:
                exact = bool(np.all(values == values[rep][codes])) and not pd.isna(values[rep]).any()
            except TypeError:  # e.g. pd.NA, whose comparisons are not booleans
                exact = False
            if exact:
                return codes.astype(np.int64, copy=False)
    try:
        codes, _ = pd.factorize(values)
    except TypeError as err:
        bad = next((i for i, v in enumerate(values) if not _hashable(v)), 0)
        raise ValueError(
            f"{name}[{rows[bad]}] = {_show(values[bad])} is not hashable ({err}); convert keys to str, int or "
            "tuple (e.g. tuple(key) for a list, key.tobytes() for an array)"
        ) from err
    missing = np.flatnonzero(codes < 0)
    if missing.size:
        i = int(rows[missing[0]])
        raise ValueError(f"{name}[{i}] is missing ({_show(values[missing[0]])}); every valid row needs an id")
    return codes.astype(np.int64, copy=False)


def _show(v: Any) -> str:
    """repr of a value for error messages, with numpy scalars shown as plain Python values."""
    return repr(v.item() if isinstance(v, np.generic) else v)


def _hashable(v: Any) -> bool:
    try:
        hash(v)
    except TypeError:
        return False
    return True
