"""GiGPO (Group-in-Group Policy Optimization, Feng et al., arXiv 2505.10978): episode term + anchor-state step term.

Notation (one row per environment step; G = episode group, S = anchor group = (G, anchor key))::

    R(tau)   = sum_t r_t                              episode return
    R_t      = sum_{k >= t} gamma^(k - t) r_k         discounted step return, in step-id order
    A_E(tau) = (R(tau) - mean_G R) / (std_G R + eps)  episode-level relative advantage (paper Eq. 3)
    A_S(t)   = (R_t - mean_S R) / (std_S R + eps)     step-level relative advantage
    A(t)     = A_E(tau) + w * A_S(t)                  broadcast over the response tokens

Paper to code, and the deviations from the reference (items 1-12): docs/estimators.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from verl_gigpo.advantage._inputs import MethodOptions, is_real
from verl_gigpo.advantage._rows import basis, differs_in_groups, normalise_in_groups
from verl_gigpo.advantage.interface import CommonOptions, StepRows, arrays_signature, split_call
from verl_gigpo.advantage.terms import AdvantageTerms, assemble
from verl_gigpo.config.rules import KeyValueError

__all__ = ["GiGPOOptions", "check_estimator_options", "compute_gigpo_advantage", "gigpo_advantage_terms", "gigpo_terms"]


def check_estimator_options(
    *,
    gamma: Any,
    step_advantage_w: Any,
    norm: Any,
    epsilon: Any,
    episode_stats: Any,
    similarity_threshold: Any = None,
) -> dict[str, Any]:
    """Validate GiGPO's options (estimator and ``GiGPOConfig`` alike); return them as keyword arguments.

    ``gamma`` in [0, 1], ``step_advantage_w`` >= 0, ``norm`` in ``NORMS``, ``epsilon`` > 0, ``episode_stats`` in
    ``EPISODE_STATS``, ``similarity_threshold`` None or in (0, 1]. Errors name the option, the value and the valid ones.
    """
    common = CommonOptions(
        gamma=gamma, norm=norm, epsilon=epsilon, episode_stats=episode_stats, similarity_threshold=similarity_threshold
    )
    return {**dataclasses.asdict(common), **GiGPOOptions(step_advantage_w=step_advantage_w).kwargs()}


def _check_gigpo_options(*, step_advantage_w: Any) -> dict[str, float]:
    if not is_real(step_advantage_w) or not 0.0 <= step_advantage_w < float("inf"):
        raise KeyValueError(
            "step_advantage_w",
            step_advantage_w,
            "must be a finite number >= 0 (the paper uses 1.0; 0 turns the step-level term off)",
        )
    return {"step_advantage_w": float(step_advantage_w)}


@dataclass(frozen=True)
class GiGPOOptions(MethodOptions):
    """GiGPO's own option ``algorithm.gigpo.step_advantage_w``: w >= 0, the weight of A_S (paper: 1; 0: A_E alone)."""

    step_advantage_w: float = 1.0

    _check = staticmethod(_check_gigpo_options)


@torch.no_grad()
def gigpo_terms(batch: StepRows, options: GiGPOOptions, common: CommonOptions) -> AdvantageTerms:
    """Per-row GiGPO terms: ``A = A_E + w * A_S`` over the valid rows (``row_mask``); other rows get 0.

    ``A_E = (R(tau) - mean_G) / (std_G + eps)`` over trajectories or step rows (``episode_stats``);
    ``A_S = (R_t - mean_S) / (std_S + eps)`` within anchor groups S; ``norm="mean"`` drops the division. Terms are (N,)
    float64; ``stats`` holds the ``gigpo/*`` diagnostics (docs/metrics.md). Details: docs/estimators.md.
    """
    base = basis(batch, common)
    w = options.step_advantage_w
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is reported by assemble
        A_S, _, _ = normalise_in_groups(base.R_t, base.s_group, base.num_s, common.norm, common.epsilon)  # (M,)
        A = base.A_E + w * A_S  # (M,)
    moving = differs_in_groups(base.R_t, base.s_group, base.num_s)[base.s_group] & (w > 0)
    return assemble(base, episode_adv=base.A_E, step_adv=A_S, advantage=A, method="gigpo", step_signal=moving)


@arrays_signature(GiGPOOptions)
def gigpo_advantage_terms(*inputs: Any, **keywords: Any) -> AdvantageTerms:
    """:func:`gigpo_terms` called with arrays: ``(step_rewards, response_mask, group_ids, traj_ids, step_ids,
    anchor_keys, *, row_mask=None, row_penalty=None, <CommonOptions and GiGPOOptions fields>)``.
    """
    return gigpo_terms(*split_call(GiGPOOptions, inputs, keywords))


@arrays_signature(GiGPOOptions)
@torch.no_grad()
def compute_gigpo_advantage(*inputs: Any, **keywords: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """GiGPO ``(advantages, returns)``, float32 ``(N, L)`` on the mask's device, both times ``response_mask``; called
    as :func:`gigpo_advantage_terms` (``returns`` holds R_t).
    """
    rows, options, common = split_call(GiGPOOptions, inputs, keywords)
    return gigpo_terms(rows, options, common).token_level(rows.response_mask)
