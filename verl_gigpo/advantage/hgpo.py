"""HGPO (Hierarchy-of-Groups Policy Optimization, He et al., arXiv 2602.22817): step credit over history-keyed groups.

Per episode group u, with R_t GiGPO's discounted step return and keys from the step's own trajectory::

    key_k(t) = (anchor_{t-k+1}, ..., anchor_t)          k = 1 .. min(K + 1, t + 1)
    C_k(t)   = rows of u with the same key_k            (C_1 = GiGPO's anchor group)
    a_k(t)   = norm(R_t within C_k(t))
    V(t)     = {k : |C_k(t)| > 1 and R_t != mean_{C_k(t)} R}    (exact-arithmetic test, _rows.at_group_mean)
    A(t)     = sum_{k in V} w_k a_k(t),   w_k = k^alpha / sum_{j in V} j^alpha     (0 when V is empty)

The method, its options and the deviations from the authors' code (items 13-17): docs/estimators.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from verl_gigpo.advantage._ids import pair_codes
from verl_gigpo.advantage._inputs import MethodOptions, check_number
from verl_gigpo.advantage._rows import (
    Basis,
    at_group_mean,
    basis,
    differs_in_groups,
    episode_at_mean,
    normalise_in_groups,
)
from verl_gigpo.advantage.interface import CommonOptions, StepRows, arrays_signature, split_call
from verl_gigpo.advantage.terms import AdvantageTerms, assemble
from verl_gigpo.config.rules import KeyValueError, Range

__all__ = ["HGPO_STAT_NAMES", "HGPOOptions", "check_hgpo_options", "hgpo_advantage_terms", "hgpo_terms"]

WEIGHT_BASES = ("depth", "depth_plus_one")
STDS = ("unbiased", "population")

HGPO_STAT_NAMES = ("hgpo/depths_used_mean", "hgpo/deepest_depth_mean", "hgpo/frac_rows_without_group")
"""HGPO's own diagnostics (beside :data:`~verl_gigpo.advantage.STAT_NAMES`), docs/estimators.md, "Metrics"."""


def check_hgpo_options(
    *, history_length: Any, alpha: Any, weight_base: Any, std: Any, episode_term: Any
) -> dict[str, Any]:
    """Validate HGPO's options (estimator and ``algorithm.hgpo`` alike); errors name the option and value."""
    Range(
        "history_length",
        "int",
        "the deepest group keys the last history_length + 1 anchor states; the paper uses the prompt's history, "
        "env.history_length = 2",
        low=0,
    ).check(history_length)
    if weight_base not in WEIGHT_BASES:
        raise KeyValueError(
            "weight_base",
            weight_base,
            "is not valid; use 'depth' (depth k weighs k^alpha, the paper) or "
            "'depth_plus_one' ((k + 1)^alpha, the authors' code)",
        )
    if std not in STDS:
        raise KeyValueError(
            "std",
            std,
            "is not valid; use 'unbiased' (divide by n - 1, as GiGPO) or 'population' (divide by n, the authors' code)",
        )
    if not isinstance(episode_term, bool | np.bool_):
        raise KeyValueError(
            "episode_term",
            episode_term,
            "must be true or false (true adds the episode-level advantage to the "
            "mix with weight 1, the authors' base_group)",
        )
    return {
        "history_length": int(history_length),
        "alpha": check_number("alpha", alpha, low=0.0, why="depth k weighs k^alpha; the paper uses 1, 0 = equal"),
        "weight_base": weight_base,
        "std": std,
        "episode_term": bool(episode_term),
    }


@dataclass(frozen=True)
class HGPOOptions(MethodOptions):
    """HGPO's options (``algorithm.hgpo.*``), validated by :func:`check_hgpo_options`; defaults: the paper."""

    history_length: int = 2
    alpha: float = 1.0
    weight_base: str = "depth"
    std: str = "unbiased"
    episode_term: bool = False

    _check = staticmethod(check_hgpo_options)


@torch.no_grad()
def hgpo_terms(batch: StepRows, options: HGPOOptions, common: CommonOptions) -> AdvantageTerms:
    """Per-row HGPO terms: ``step_adv`` = the weighted mean over the depths in V (module docstring), (N,) each.

    With ``episode_term`` the episode item A_E joins the mix with weight 1, so ``advantage`` is not
    ``episode_adv + step_adv``. ``extras``: ``depths_used`` |V| and ``deepest_depth`` max V; ``stats``: also ``hgpo/*``.
    """
    base = basis(batch, common)
    A_E = base.A_E  # (M,)
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is reported by assemble
        total, weight, used, deepest = _depth_mix(base, options, common.norm, common.epsilon)  # (M,) each
        A_step = np.where(weight > 0, total / np.where(weight > 0, weight, 1.0), 0.0)  # (M,)
        if options.episode_term:
            at_mean = episode_at_mean(
                base.rows, base.R_traj, common.episode_stats, row_scores=base.R_row
            )  # (M,) A_E is 0 exactly
            item = (~at_mean).astype(np.float64)  # (M,) the episode item, weight 1^alpha = 1, when nonzero
            mixed = weight + item
            A = np.where(mixed > 0, (total + item * A_E) / np.where(mixed > 0, mixed, 1.0), 0.0)
            A_episode = A_E
        else:
            A, A_episode = A_step, np.zeros_like(A_E)
    m = base.rows.m
    stats = {
        "hgpo/depths_used_mean": float(used.mean()) if m else 0.0,
        "hgpo/deepest_depth_mean": float(deepest.mean()) if m else 0.0,
        "hgpo/frac_rows_without_group": float((used == 0).mean()) if m else 0.0,
    }
    extras = {"depths_used": used, "deepest_depth": deepest}
    # deeper groups nest in the depth-1 group (the anchor group): R_t differs in one only if it differs there
    moving = differs_in_groups(base.R_t, base.s_group, base.num_s)[base.s_group]  # (M,)
    return assemble(
        base,
        episode_adv=A_episode,
        step_adv=A_step,
        advantage=A,
        method="hgpo",
        step_signal=moving,
        episode_signal=base.episode_signal & options.episode_term,
        stats=stats,
        extras=extras,
    )


def _depth_mix(
    base: Basis, options: HGPOOptions, norm: str, epsilon: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(sum_k w_k a_k, sum_k w_k, |V|, max V)``, each (M,); key_k(t) = (key_{k-1}(t - 1), (u, anchor_t))."""
    rows, s_group, R_t = base.rows, base.s_group, base.R_t
    m = rows.m
    total, weight = np.zeros(m), np.zeros(m)
    used, deepest = np.zeros(m), np.zeros(m)
    ddof = 1 if options.std == "unbiased" else 0
    offset = 0 if options.weight_base == "depth" else 1
    key, num_keys = s_group, base.num_s  # depth 1: (u, anchor_t), defined on every row
    defined = np.ones(m, dtype=bool)
    for k in range(1, options.history_length + 2):
        if k > 1:
            has_prev = rows.prev >= 0
            defined = has_prev & defined[np.where(has_prev, rows.prev, 0)]  # t >= k - 1
            rows_k = np.flatnonzero(defined)
            deeper = np.full(m, -1, dtype=np.int64)
            deeper[rows_k], num_keys = pair_codes(key[rows.prev[rows_k]], s_group[rows_k])
            key = deeper
        rows_k = np.flatnonzero(defined)  # (M_k,)
        a_k, size, _ = normalise_in_groups(R_t[rows_k], key[rows_k], num_keys, norm, epsilon, ddof=ddof)
        in_v = (size[key[rows_k]] > 1) & ~at_group_mean(R_t[rows_k], key[rows_k], num_keys)  # (M_k,) k in V(t)
        take = rows_k[in_v]
        w = float(k + offset) ** options.alpha
        total[take] += w * a_k[in_v]
        weight[take] += w
        used[take] += 1
        deepest[take] = k
    return total, weight, used, deepest


@arrays_signature(HGPOOptions)
def hgpo_advantage_terms(*inputs: Any, **keywords: Any) -> AdvantageTerms:
    """:func:`hgpo_terms` called with arrays, as :func:`verl_gigpo.advantage.gigpo_advantage_terms` (the
    :class:`HGPOOptions` fields as keywords).
    """
    return hgpo_terms(*split_call(HGPOOptions, inputs, keywords))
