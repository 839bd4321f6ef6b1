"""GRPO and RLOO on step rows, computed the same way on both engines with verl's own outcome estimators.

One score per trajectory, grouped by task; each trajectory's advantage is broadcast to its step rows, and masked
rows (padding copies, failed episodes) take part in no statistic. How this relates to verl's V1 step and to the
reference's ``penalty_mode="reference"``: docs/estimators.md, "The GRPO and RLOO baselines".
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
    """(N,) float64 advantage per step row of ``steps`` (a ``StepBatch``) from verl's ``grpo`` or ``rloo``; 0 if masked.

    Over the n_g unmasked trajectories of group g, ``R_tau = sum_t r_t``: grpo ``A = (R_tau - mean_g R) / (std_g R +
    1e-6)`` (or ``R_tau - mean_g R`` without ``norm_adv_by_std``); rloo ``A = n_g / (n_g - 1) * (R_tau - mean_g R)``.
    A lone trajectory gets ``R_tau``. ``penalty_mode="reference"`` scores rows ``S_t = sum_k r^env_k - p_t`` instead.
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
