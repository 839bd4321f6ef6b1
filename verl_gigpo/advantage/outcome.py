"""GRPO and RLOO on step rows, computed the same way on both engines.

verl's own outcome estimators (``verl.trainer.ppo.core_algos.compute_grpo_outcome_advantage`` and
``compute_rloo_outcome_advantage``) are fed one score per trajectory, grouped by task, and each trajectory's
advantage is broadcast to its step rows. Rows that are masked (verl's padding copies, and episodes whose
environment failed) take part in no group statistic and get advantage 0. A failed episode is an infrastructure
fault, not a zero-return attempt, so it does not lower its group's mean.

On verl's engine, this is what the ``gigpo_sync`` trainer mode runs for ``algorithm.adv_estimator=grpo`` or ``rloo``
(unless ``algorithm.use_kl_in_reward`` is set, which leaves the step to verl). With no failed episode, GRPO equals
verl 0.9.1's own V1 computation, which scores only the final row of each session
(``verl.trainer.ppo.v1.utils.compute_advantage_for_multi_trajectories``). verl's V1 trainer runs RLOO over
rows instead. There, a trajectory's own other rows sit in its leave-one-out baseline, so scoring trajectories is
what RLOO means for multi-step episodes.

With ``env.invalid_action_penalty_mode=reference`` both are computed as the reference implementation computes them
(its ``compute_grpo_outcome_advantage`` / ``compute_rloo_outcome_advantage`` with ``compute_mean_std_cross_steps``,
after its trainer's ``apply_invalid_action_penalty``): each unmasked ROW scores its episode's environment reward minus
its own invalid-action penalty, and the group statistics run over those rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["OUTCOME_ESTIMATORS", "outcome_advantages"]

#: verl's outcome estimators that both engines compute on step rows with :func:`outcome_advantages`
OUTCOME_ESTIMATORS = ("grpo", "rloo")


def outcome_advantages(
    steps: Any,
    estimator: str,
    *,
    norm_adv_by_std: bool = True,
    penalty_mode: str = "reward",
    invalid_action_penalty: float = 0.0,
) -> np.ndarray:
    """One advantage per step row from verl's outcome estimator on the trajectories' returns.

    Each unmasked trajectory tau of episode group g scores ``R_tau = sum_t r_t`` (its step rewards,
    :meth:`verl_gigpo.rollout.step_rows.StepBatch.trajectory_scores`). Over the ``n_g`` unmasked trajectories of g:

    * ``grpo``: ``A_tau = (R_tau - mean_g R) / (std_g R + 1e-6)`` (unbiased std), or ``R_tau - mean_g R`` when
      ``norm_adv_by_std`` is False (Dr.GRPO);
    * ``rloo``: ``A_tau = n_g / (n_g - 1) * (R_tau - mean_g R)``, i.e. ``R_tau`` minus the mean of the others.

    A group with one unmasked trajectory follows verl's rule (mean 0, std 1), so its advantage is ``R_tau``.

    ``penalty_mode="reference"``: the scores are per unmasked row instead, ``S_t = sum_k r^env_k - p_t`` (the
    episode's environment rewards, minus the row's own penalty ``p_t = invalid_action_penalty * (1 - valid_t)``), and
    the same two formulas run over the group's rows (``n_g`` rows; a group of one row: mean 0, std 1).

    Args:
        steps: the batch's step rows (a :class:`~verl_gigpo.rollout.step_rows.StepBatch`, N rows).
        estimator: ``"grpo"`` or ``"rloo"``.
        norm_adv_by_std: ``algorithm.norm_adv_by_std_in_grpo`` (GRPO only).
        penalty_mode: ``env.invalid_action_penalty_mode`` (:data:`verl_gigpo.config.rules.PENALTY_MODES`).
        invalid_action_penalty: ``env.invalid_action_penalty`` (read in ``"reference"`` mode).

    Returns:
        (N,) float64: each row's trajectory advantage; 0 on masked rows.

    Raises:
        ValueError: for an estimator other than ``grpo`` or ``rloo``, or a ``penalty_mode`` outside
            :data:`verl_gigpo.config.rules.PENALTY_MODES`.
    """
    from verl_gigpo.advantage._inputs import invalid_row_penalty
    from verl_gigpo.config.rules import penalty_mode as check_mode

    if estimator not in OUTCOME_ESTIMATORS:
        raise ValueError(f"outcome_advantages computes {list(OUTCOME_ESTIMATORS)}, not {estimator!r}")
    mode = check_mode({"invalid_action_penalty_mode": penalty_mode})
    traj_of_row, returns, groups = steps.trajectory_scores(env_rewards=mode == "reference")  # (N,), (T,), (T,)
    if returns.size == 0:  # every row masked
        return np.zeros(len(traj_of_row))
    if mode == "reference":  # one score per unmasked row: its episode's environment return minus its own penalty
        real = np.flatnonzero(traj_of_row >= 0)  # (M,)
        penalty = invalid_row_penalty(steps.action_valid, invalid_action_penalty, len(steps))  # (N,)
        per_row = _verl_outcome(
            returns[traj_of_row[real]] - penalty[real], groups[traj_of_row[real]], estimator, norm_adv_by_std
        )
        out = np.zeros(len(traj_of_row))
        out[real] = per_row
        return out
    per_traj = _verl_outcome(returns, groups, estimator, norm_adv_by_std)  # (T,)
    return np.where(traj_of_row >= 0, per_traj[np.maximum(traj_of_row, 0)], 0.0)


def _verl_outcome(scores: np.ndarray, groups: np.ndarray, estimator: str, norm_adv_by_std: bool) -> np.ndarray:
    """verl's ``core_algos`` GRPO / RLOO on one score per item ``(K,)`` grouped by ``groups`` ``(K,)``; ``(K,)``."""
    import torch
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, compute_rloo_outcome_advantage

    tensor = torch.as_tensor(scores, dtype=torch.float64)[:, None]  # (K, 1): one "token" per item, float64 as given
    mask = torch.ones_like(tensor)  # (K, 1)
    if estimator == "grpo":
        adv, _ = compute_grpo_outcome_advantage(tensor, mask, groups, norm_adv_by_std_in_grpo=bool(norm_adv_by_std))
    else:
        adv, _ = compute_rloo_outcome_advantage(tensor, mask, groups)
    return adv[:, 0].double().numpy()
