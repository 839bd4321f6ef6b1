"""GraphGPO (Graph-based Group Policy Optimization, Cheng et al., arXiv 2605.26684): credit by distance to success.

Per episode group u, its trajectories merged into one state graph (nodes: anchor groups of u, plus SUCCESS)::

    edges    s_t -> s_{t+1}; a won trajectory's last step -> SUCCESS; a lost one's -> a dead end
    d(s)     breadth-first distance from s to SUCCESS; unreachable and dead ends: d_max(u) + 1
    R_G(t)   = r_succ * omega^d(s_{t+1})
    A_G(t)   = norm(R_G within the anchor group of s_t)          0 in a group with no win
    A(t)     = beta_E A_E(t) + beta_G A_G(t)

The method, its options and the deviations from the authors' code (items 18-21): docs/estimators.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from verl_gigpo.advantage._inputs import MethodOptions, as_flags, check_number
from verl_gigpo.advantage._rows import ValidRows, basis, differs_in_groups, normalise_in_groups
from verl_gigpo.advantage.interface import CommonOptions, StepRows, arrays_signature, split_call
from verl_gigpo.advantage.terms import AdvantageTerms, assemble
from verl_gigpo.config.rules import KeyValueError

__all__ = [
    "GRAPHGPO_STAT_NAMES",
    "GraphGPOOptions",
    "check_graphgpo_options",
    "graph_distances",
    "graphgpo_advantage_terms",
    "graphgpo_terms",
]

GRAPHGPO_STAT_NAMES = (
    "graphgpo/frac_groups_with_win",
    "graphgpo/frac_rows_reaching_success",
    "graphgpo/next_distance_mean",
)
"""GraphGPO's own diagnostics (beside :data:`~verl_gigpo.advantage.STAT_NAMES`), docs/estimators.md, "Metrics"."""


def check_graphgpo_options(
    *,
    omega: Any,
    success_reward: Any,
    episode_advantage_w: Any,
    step_advantage_w: Any,
    invalid_penalty: Any,
    progress: Any,
) -> dict[str, Any]:
    """Validate GraphGPO's options (estimator and ``algorithm.graphgpo`` alike); errors name the option and value."""
    if not isinstance(progress, bool | np.bool_):
        raise KeyValueError(
            "progress",
            progress,
            "must be true or false (true: R_G = r_succ * omega^(d(next) - d(current) + 1), "
            "the authors' normalize_distance)",
        )
    why_w = "weight of the {} term; the paper uses 1, 0 turns it off"
    return {
        "omega": check_number(
            "omega", omega, low=0.0, high=1.0, low_open=True, why="R_G = r_succ * omega^d; ALFWorld 0.1, WebShop 0.2"
        ),
        "success_reward": check_number(
            "success_reward", success_reward, low=0.0, low_open=True, why="the return of reaching SUCCESS; code: 10"
        ),
        "episode_advantage_w": check_number(
            "episode_advantage_w", episode_advantage_w, low=0.0, why=why_w.format("episode-level")
        ),
        "step_advantage_w": check_number("step_advantage_w", step_advantage_w, low=0.0, why=why_w.format("graph")),
        "invalid_penalty": check_number(
            "invalid_penalty", invalid_penalty, low=0.0, why="subtracted from R_G on a step without a valid action"
        ),
        "progress": bool(progress),
    }


@dataclass(frozen=True)
class GraphGPOOptions(MethodOptions):
    """GraphGPO's options (``algorithm.graphgpo.*``), validated by :func:`check_graphgpo_options`; defaults: the
    paper's ALFWorld setting.
    """

    omega: float = 0.1
    success_reward: float = 10.0
    episode_advantage_w: float = 1.0
    step_advantage_w: float = 1.0
    invalid_penalty: float = 0.0
    progress: bool = False

    _check = staticmethod(check_graphgpo_options)


@torch.no_grad()
def graphgpo_terms(batch: StepRows, options: GraphGPOOptions, common: CommonOptions) -> AdvantageTerms:
    """Per-row GraphGPO terms, (N,) each: ``episode_adv`` A_E, ``step_adv`` A_G, ``advantage`` beta_E A_E + beta_G A_G.

    Needs ``won`` (and ``action_valid`` when ``invalid_penalty`` > 0). ``extras``: ``distance`` d(s_t),
    ``next_distance`` d(s_{t+1}), ``graph_return`` R_G; ``stats``: also ``graphgpo/*`` (docs/estimators.md, "Metrics").
    """
    base = basis(batch, common)
    rows, s_group = base.rows, base.s_group
    won_traj = rows.per_trajectory(as_flags(batch.won, "won", rows.n, needed_by="graphgpo"), "won")  # (T,)
    invalid = np.zeros(rows.m, dtype=bool)
    if options.invalid_penalty > 0:
        valid = as_flags(batch.action_valid, "action_valid", rows.n, needed_by="graphgpo with invalid_penalty > 0")
        invalid = ~valid[rows.rows]  # (M,)
    d_cur, d_next, reaching, group_won = graph_distances(rows, s_group, base.num_s, won_traj)
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is reported by assemble
        exponent = d_next - d_cur + 1 if options.progress else d_next  # (M,)
        R_G = options.success_reward * options.omega**exponent - options.invalid_penalty * invalid
        R_G = R_G - base.penalty  # (M,) the row's own penalty (row_penalty), after the graph return
        A_G, _, _ = normalise_in_groups(R_G, s_group, base.num_s, common.norm, common.epsilon)  # (M,)
        A_G[~group_won[rows.g]] = 0.0  # a group with no win has no distance signal
        A = options.episode_advantage_w * base.A_E + options.step_advantage_w * A_G
    in_won = group_won[rows.g]  # (M,)
    stats = {
        "graphgpo/frac_groups_with_win": float(group_won.mean()) if rows.num_groups else 0.0,
        "graphgpo/frac_rows_reaching_success": float(reaching.mean()) if rows.m else 0.0,
        "graphgpo/next_distance_mean": float(d_next[in_won].mean()) if in_won.any() else 0.0,
    }
    extras = {"distance": d_cur, "next_distance": d_next, "graph_return": R_G}
    moving = differs_in_groups(R_G, s_group, base.num_s)[s_group] & in_won & (options.step_advantage_w > 0)
    return assemble(
        base,
        episode_adv=base.A_E,
        step_adv=A_G,
        advantage=A,
        method="graphgpo",
        step_signal=moving,
        episode_signal=base.episode_signal & (options.episode_advantage_w > 0),
        stats=stats,
        extras=extras,
    )


def graph_distances(
    rows: ValidRows, node: np.ndarray, num_nodes: int, won_traj: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``d(s_t)`` (M,), ``d(s_{t+1})`` (M,), ``reaching`` (M,) bool, ``group_won`` (G,): one BFS for all groups.

    ``node`` (M,) graph node of each row's state (< ``num_nodes``), ``won_traj`` (T,) bool.
    """
    has_next = rows.next >= 0  # (M,)
    won_row = won_traj[rows.t]  # (M,)
    win_end = ~has_next & won_row  # (M,) last steps of won trajectories: -> SUCCESS
    src = np.r_[node[has_next], node[win_end]]  # (E,) edge s_t -> s_{t+1} / SUCCESS
    dst = np.r_[node[rows.next[has_next]], num_nodes + rows.g[win_end]]  # (E,)
    total = num_nodes + rows.num_groups
    by_dst = np.argsort(dst, kind="stable")
    incoming = src[by_dst]  # (E,) sources, grouped by their edge's target
    count = np.bincount(dst, minlength=total)  # (S + G,) in-degree
    first = np.cumsum(count) - count  # (S + G,) offset of each target's sources in `incoming`
    dist = np.full(total, -1, dtype=np.int64)
    group_won = np.zeros(rows.num_groups, dtype=bool)
    group_won[rows.g[win_end]] = True
    frontier = num_nodes + np.flatnonzero(group_won)
    dist[frontier] = 0
    level = 0
    while frontier.size:
        c = count[frontier]
        offsets = np.repeat(first[frontier] - (np.cumsum(c) - c), c) + np.arange(int(c.sum()))
        preds = incoming[offsets]
        frontier = np.unique(preds[dist[preds] < 0])
        level += 1
        dist[frontier] = level
    node_group = np.empty(num_nodes, dtype=np.int64)
    node_group[node] = rows.g
    finite = dist[:num_nodes] >= 0
    d_max = np.zeros(rows.num_groups, dtype=np.int64)  # (G,) largest finite distance (SUCCESS: 0)
    np.maximum.at(d_max, node_group[finite], dist[:num_nodes][finite])
    d_node = np.where(finite, dist[:num_nodes], d_max[node_group] + 1).astype(np.float64)  # (S,)
    d_after_end = np.where(won_row, 0.0, d_max[rows.g] + 1.0)  # (M,) SUCCESS or a dead end
    d_next = np.where(has_next, d_node[node[np.where(has_next, rows.next, 0)]], d_after_end)
    return d_node[node], d_next, finite[node], group_won


@arrays_signature(GraphGPOOptions, outcome=True)
def graphgpo_advantage_terms(*inputs: Any, **keywords: Any) -> AdvantageTerms:
    """:func:`graphgpo_terms` in the arrays form of :func:`~verl_gigpo.advantage.gigpo_advantage_terms`."""
    return graphgpo_terms(*split_call(GraphGPOOptions, inputs, keywords, outcome=True))
