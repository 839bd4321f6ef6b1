"""G2PO (Group-Graph Policy Optimization, Wang et al., arXiv 2606.22995): one-step TD over merged states.

Per episode group u, g(s) = its rows whose anchor is s, T_tau = steps of tau, t the 0-based position::

    V(g)   = mean over the rows (tau, t) of g of gamma^(T_tau - t) * R_tau      R_tau = r_succ if tau won, else 0
    V'(t)  = V(g(s_{t+1}));  on a trajectory's last step r_succ if it won, else 0
    A_1(t) = norm(V'(t) - c * invalid_t  within g(s_t))        0 for a singleton
    A_2(t) = norm(V'(t) - V(g(s_t))      over all rows of u)
    A(t)   = A_E(t) + w * (A_1(t) + A_2(t))

The method, its options and the deviations from the authors' code (items 22-25): docs/estimators.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from verl_gigpo.advantage._inputs import MethodOptions, as_flags, check_number
from verl_gigpo.advantage._rows import basis, differs_in_groups, normalise_in_groups
from verl_gigpo.advantage.interface import CommonOptions, StepRows, arrays_signature, split_call
from verl_gigpo.advantage.terms import AdvantageTerms, assemble

__all__ = ["G2PO_STAT_NAMES", "G2POOptions", "check_g2po_options", "g2po_advantage_terms", "g2po_terms"]

G2PO_STAT_NAMES = ("g2po/node_value_mean", "g2po/td_abs_mean")
"""G2PO's own diagnostics (beside :data:`~verl_gigpo.advantage.STAT_NAMES`), docs/estimators.md, "Metrics"."""


def check_g2po_options(*, success_reward: Any, invalid_penalty: Any, step_advantage_w: Any) -> dict[str, float]:
    """Validate G2PO's options (estimator and ``algorithm.g2po`` alike); errors name the option and value."""
    return {
        "success_reward": check_number(
            "success_reward", success_reward, low=0.0, low_open=True, why="R_tau of a won episode; code: 10"
        ),
        "invalid_penalty": check_number(
            "invalid_penalty", invalid_penalty, low=0.0, why="c, subtracted from V' on a step without a valid action"
        ),
        "step_advantage_w": check_number(
            "step_advantage_w", step_advantage_w, low=0.0, why="w of A_1 + A_2; the paper uses 1, 0 turns it off"
        ),
    }


@dataclass(frozen=True)
class G2POOptions(MethodOptions):
    """G2PO's options (``algorithm.g2po.*``), validated by :func:`check_g2po_options`; defaults: the paper."""

    success_reward: float = 10.0
    invalid_penalty: float = 0.1
    step_advantage_w: float = 1.0

    _check = staticmethod(check_g2po_options)


@torch.no_grad()
def g2po_terms(batch: StepRows, options: G2POOptions, common: CommonOptions) -> AdvantageTerms:
    """Per-row G2PO terms, (N,) each: ``episode_adv`` A_E, ``step_adv`` A_1 + A_2, ``advantage`` A_E + w (A_1 + A_2).

    Needs ``won`` (and ``action_valid`` when ``invalid_penalty`` > 0); ``row_penalty`` changes the episode score only.
    ``extras``: ``node_value`` V(g(s_t)), ``next_value`` V'(t); ``stats``: also ``g2po/*`` (docs/estimators.md).
    """
    base = basis(batch, common)
    rows, s_group, num_s, eps = base.rows, base.s_group, base.num_s, common.epsilon
    won_traj = rows.per_trajectory(as_flags(batch.won, "won", rows.n, needed_by="g2po"), "won")  # (T,)
    invalid = np.zeros(rows.m, dtype=bool)
    if options.invalid_penalty > 0:
        flags = as_flags(batch.action_valid, "action_valid", rows.n, needed_by="g2po with invalid_penalty > 0")
        invalid = ~flags[rows.rows]  # (M,)
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is reported by assemble
        outcome = options.success_reward * won_traj  # (T,) R_tau
        visit = common.gamma ** (rows.traj_len[rows.t] - rows.pos) * outcome[rows.t]  # (M,) gamma^(T - t) R_tau
        V = np.bincount(s_group, weights=visit, minlength=num_s) / np.bincount(s_group, minlength=num_s)  # (S,)
        has_next = rows.next >= 0
        V_next = np.where(has_next, V[s_group[np.where(has_next, rows.next, 0)]], outcome[rows.t])  # (M,)
        x_1 = V_next - options.invalid_penalty * invalid  # (M,) what A_1 normalises
        A_1, _, _ = normalise_in_groups(x_1, s_group, num_s, common.norm, eps)
        td = V_next - V[s_group]  # (M,)
        A_2, _, _ = normalise_in_groups(td, rows.g, rows.num_groups, common.norm, eps)
        A_step = A_1 + A_2  # (M,)
        A = base.A_E + options.step_advantage_w * A_step
    stats = {
        "g2po/node_value_mean": float(V[s_group].mean()) if rows.m else 0.0,
        "g2po/td_abs_mean": float(np.abs(td).mean()) if rows.m else 0.0,
    }
    extras = {"node_value": V[s_group], "next_value": V_next}
    moving = differs_in_groups(x_1, s_group, num_s)[s_group] | differs_in_groups(td, rows.g, rows.num_groups)[rows.g]
    moving &= options.step_advantage_w > 0
    return assemble(
        base,
        episode_adv=base.A_E,
        step_adv=A_step,
        advantage=A,
        method="g2po",
        step_signal=moving,
        stats=stats,
        extras=extras,
    )


@arrays_signature(G2POOptions, outcome=True)
def g2po_advantage_terms(*inputs: Any, **keywords: Any) -> AdvantageTerms:
    """G2PO's arrays form (``won``, ``action_valid`` and :class:`G2POOptions` as keywords); see :func:`g2po_terms`."""
    return g2po_terms(*split_call(G2POOptions, inputs, keywords, outcome=True))
