"""GiGPO (Group-in-Group Policy Optimization, Feng et al., arXiv 2505.10978): episode term + anchor-state step term.

Pure maths over tensors and id arrays: no verl types, no I/O, no prints. Notation (one training row per
environment step)::

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

The deliberate deviations from the reference implementation (verl-agent, ``gigpo/core_gigpo.py``) are numbered
once, for every estimator, in :mod:`verl_gigpo.advantage` (1-12 are GiGPO's).
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
    """Validate GiGPO's options; the one check that both the estimator and ``GiGPOConfig`` use.

    Valid values: ``gamma`` a number in [0, 1] (0: R_t = r_t; 1: no discount), ``step_advantage_w`` a finite
    number >= 0 (0: the episode-level term alone), ``norm`` in :data:`~verl_gigpo.advantage.NORMS`, ``epsilon`` a
    finite number > 0, ``episode_stats`` in :data:`~verl_gigpo.advantage.EPISODE_STATS`, ``similarity_threshold``
    None (exact keys) or a number in (0, 1] (:func:`verl_gigpo.advantage.anchors.check_similarity_threshold`). Booleans
    and strings are not numbers.

    Returns:
        the options as a dict, numbers as Python floats (the keyword arguments of :func:`compute_gigpo_advantage`).

    Raises:
        ValueError: naming the option, the value given and the valid values.
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
    """GiGPO's own option (``algorithm.gigpo.step_advantage_w``): w >= 0, the weight of A_S (paper: 1; 0: A_E alone).
    The shared options are :class:`~verl_gigpo.advantage.CommonOptions`."""

    step_advantage_w: float = 1.0

    _check = staticmethod(_check_gigpo_options)


@torch.no_grad()
def gigpo_terms(batch: StepRows, options: GiGPOOptions, common: CommonOptions) -> AdvantageTerms:
    """Per-row GiGPO terms and diagnostics: ``A = A_E + w A_S`` (combined advantage; see paper).

    Only *valid* rows (``row_mask`` True; all rows when ``row_mask`` is None) are used; the others take part in
    no statistic and no validation of ids, and get 0 in every output. verl's padding rows are deep copies of
    real rows (same trajectory id, same step id), so they must be masked out here.

    Maths, over valid rows:

    * Episode return: ``R(tau) = sum_t r_t`` over the trajectory's rows; each row carries its trajectory's.
    * Step return: ``R_t = sum_{k >= t} gamma^(k - t) r_k``, i.e. ``R_t = r_t + gamma * R_{t+1}``, along the
      trajectory's rows sorted by ``step_ids``. Rows consecutive in step-id order are consecutive steps: ids
      ``0, 2, 5`` are treated as steps 0, 1, 2 (a gap in the ids does not add discounting). Computed in float64
      by a segmented doubling scan (``ceil(log2 T_max)`` vector passes, T_max = longest trajectory, see
      :func:`~verl_gigpo.advantage.discounted_step_returns`) that only multiplies by powers of gamma <= 1: exact up
      to rounding for any length.
    * Episode-level relative advantage (paper Eq. 3), within each episode group G:
      ``A_E(tau) = (R(tau) - mean_G) / (std_G + epsilon)``. With ``episode_stats="trajectory"`` the mean and
      std are over the group's trajectories (each counts once); with ``"step"`` over its valid rows (each row
      contributes its trajectory's return, so longer trajectories weigh more, as in the reference code).
    * Anchor state grouping (see paper): the anchor group of a row is the pair (episode group, anchor key). With
      ``similarity_threshold`` t < 1 the key is first replaced by its similarity group among the valid rows of its
      episode group: the connected components of "identical texts, or shingle similarity >= t"
      (:func:`verl_gigpo.advantage.anchors.anchor_group_ids`; order-independent).
    * Step-level relative advantage (see paper), within each anchor group S:
      ``A_S(t) = (R_t - mean_S) / (std_S + epsilon)``.
    * Combined (see paper): ``A = A_E + step_advantage_w * A_S``.
    * ``row_penalty`` p (None: none) is the reference implementation's placement of the invalid-action penalty
      (its trainer's ``apply_invalid_action_penalty``): with ``step_rewards`` the environment's rewards alone, each
      row's own penalty is subtracted after discounting, ``R_t - p_t``, and from its own episode score,
      ``R(tau) - p_t``, and A_E normalises those per-row scores over the group's step rows (it needs
      ``episode_stats="step"``). Without it, shaping is part of r_t before discounting and R(tau) sums it.
    * ``norm="mean_std"`` uses ``std = sqrt(sum (x - mean)^2 / (n - 1))`` (unbiased); ``norm="mean"`` uses
      ``x - mean`` only (the paper's choice for WebShop). A group of one member, or one whose members are all
      equal, gets exactly 0.

    Args:
        batch: the rows (:class:`~verl_gigpo.advantage.StepRows`; ``won`` and ``action_valid`` are not read). Ids
            (``group_ids``, ``traj_ids``, ``anchor_keys``) may be ints, strings or any hashables (a 1-D
            ``np.ndarray``, ``dtype=object`` for tuples; lists are converted); ``step_ids`` whole numbers.
        options: w. common: gamma, norm, epsilon, episode_stats, similarity_threshold.

    Returns:
        :class:`~verl_gigpo.advantage.AdvantageTerms` with per-row float64 terms and ``stats``:

        * ``gigpo/num_episode_groups``: distinct episode groups among valid rows.
        * ``gigpo/num_step_groups``: distinct anchor groups (episode group, anchor key) among valid rows.
        * ``gigpo/step_group_size_mean``: mean number of valid rows per anchor group.
        * ``gigpo/step_group_size_max``: size of the largest anchor group.
        * ``gigpo/frac_singleton_step_groups``: fraction of anchor groups with one row (their A_S is 0).
        * ``gigpo/frac_rows_in_singleton_step_groups``: fraction of valid rows that sit alone in their anchor
          group, i.e. get no step-level signal.
        * ``gigpo/frac_zero_std_episode_groups``: fraction of episode groups whose trajectories all have the
          same return (one-trajectory groups included), i.e. whose episode-level term is 0.
        * ``gigpo/frac_rows_nonzero_step_adv``: fraction of valid rows whose step term is not 0 (|A_S| > 1e-6).
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
    anchor_keys, *, row_mask=None, row_penalty=None, <CommonOptions and GiGPOOptions fields>)``."""
    return gigpo_terms(*split_call(GiGPOOptions, inputs, keywords))


@arrays_signature(GiGPOOptions)
@torch.no_grad()
def compute_gigpo_advantage(*inputs: Any, **keywords: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """GiGPO ``(advantages, returns)``, float32 ``(N, L)`` on the mask's device, both times ``response_mask``; called
    as :func:`gigpo_advantage_terms` (``returns`` holds R_t)."""
    rows, options, common = split_call(GiGPOOptions, inputs, keywords)
    return gigpo_terms(rows, options, common).token_level(rows.response_mask)
