"""Loop oracles of HGPO, GraphGPO and G2PO: the equations of ``verl_gigpo/advantage/{hgpo,graphgpo,g2po}.py``
written the slow, obvious way (dicts, lists, a deque), one trajectory and one group at a time.

Shared by ``tests/test_successors.py`` and ``benchmarks/bench_advantage.py`` (``tests/helpers`` is on pytest's
pythonpath). R_t and the episode term A_E come from the GiGPO oracle (``gigpo_oracle.loop_gigpo_terms``); nothing
is imported from ``verl_gigpo``. Every function returns a dict of per-row lists (masked rows: 0) with the keys
``episode_adv``, ``step_adv``, ``advantage`` and the method's extras. Exact anchor keys only.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque

from gigpo_oracle import loop_gigpo_terms

__all__ = ["loop_g2po_terms", "loop_graphgpo_terms", "loop_hgpo_terms"]


def _normalise(members, norm, epsilon, ddof=1):
    """members: [(row, value), ...] of one group -> {row: normalised value}; a group of one, or of equal values,
    gets 0."""
    values = [v for _, v in members]
    k = len(values)
    if k == 1 or all(v == values[0] for v in values):
        return {row: 0.0 for row, _ in members}
    mean = sum(values) / k
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (k - ddof))
    return {row: (v - mean) / (std + epsilon) if norm == "mean_std" else v - mean for row, v in members}


def _off_mean(value, mean):
    """The exact rule of "value - mean != 0": more than 1e-12 * max(1, |mean|) apart (a float remainder of a value
    at its group's mean is zero)."""
    return abs(value - mean) > 1e-12 * max(1.0, abs(mean))


def _trajectories(n, valid, group_ids, traj_ids, step_ids):
    """{traj: [rows in step-id order]} over valid rows, and {traj: group}."""
    rows_of = defaultdict(list)
    group_of = {}
    for i in range(n):
        if valid[i]:
            rows_of[traj_ids[i]].append(i)
            group_of[traj_ids[i]] = group_ids[i]
    return {t: sorted(rows, key=lambda i: int(step_ids[i])) for t, rows in rows_of.items()}, group_of


def _common(step_rewards, group_ids, traj_ids, step_ids, anchor_keys, row_mask, gamma, norm, epsilon, episode_stats):
    n = len(step_rewards)
    valid = [True] * n if row_mask is None else [bool(v) for v in row_mask]
    base = loop_gigpo_terms(
        step_rewards,
        group_ids,
        traj_ids,
        step_ids,
        anchor_keys,
        row_mask=valid,
        gamma=gamma,
        step_advantage_w=0.0,
        norm=norm,
        epsilon=epsilon,
        episode_stats=episode_stats,
    )
    trajs, group_of = _trajectories(n, valid, group_ids, traj_ids, step_ids)
    return n, valid, base, trajs, group_of


def loop_hgpo_terms(
    step_rewards,
    group_ids,
    traj_ids,
    step_ids,
    anchor_keys,
    *,
    row_mask=None,
    gamma=0.95,
    norm="mean_std",
    epsilon=1e-6,
    episode_stats="trajectory",
    history_length=2,
    alpha=1.0,
    weight_base="depth",
    std="unbiased",
    episode_term=False,
):
    """HGPO: key_k(t) = (u, anchor_{t-k+1..t}) for k = 1..min(K+1, t+1); a_k = norm(R_t within C_k) where
    |C_k| > 1; A = sum over V = {k: |C_k| > 1, R_t off the mean of C_k} of w_k a_k / sum w_k, w_k = k^alpha
    ((k+1)^alpha); with ``episode_term`` A_E joins (weight 1) when the episode return is off its group's mean.
    Also ``rounding_ties``: the (row, depth) items at their group's mean whose float a_k is not 0."""
    n, valid, base, trajs, group_of = _common(
        step_rewards, group_ids, traj_ids, step_ids, anchor_keys, row_mask, gamma, norm, epsilon, episode_stats
    )
    R_t, A_E = base["step_return"], base["episode_adv"]
    episode_mean = _episode_means(base["episode_return"], trajs, group_of, episode_stats)  # row -> mean
    members = defaultdict(list)  # (k, group, key tuple) -> [(row, R_t)]
    for traj, rows in trajs.items():
        for t, i in enumerate(rows):
            for k in range(1, min(history_length + 1, t + 1) + 1):
                key = tuple(anchor_keys[rows[j]] for j in range(t - k + 1, t + 1))
                members[(k, group_of[traj], key)].append((i, R_t[i]))
    items = defaultdict(list)  # row -> [(k, a_k)]
    ddof = 1 if std == "unbiased" else 0
    rounding_ties = 0
    for (k, _, _), group in members.items():
        if len(group) > 1:
            mean = sum(v for _, v in group) / len(group)
            normalised = _normalise(group, norm, epsilon, ddof)
            for i, v in group:
                if _off_mean(v, mean):
                    items[i].append((k, normalised[i]))
                elif normalised[i] != 0:
                    rounding_ties += 1  # at the mean, but floats left a remainder: a_k != 0 would keep it
    step_adv, advantage, used, deepest = [0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n
    episode_adv = [A_E[i] if episode_term else 0.0 for i in range(n)]
    for i in range(n):
        if not valid[i]:
            continue
        weights = [(k + (weight_base == "depth_plus_one")) ** alpha for k, _ in items[i]]
        if items[i]:
            step_adv[i] = sum(w * a for w, (_, a) in zip(weights, items[i], strict=True)) / sum(weights)
            used[i], deepest[i] = float(len(items[i])), float(max(k for k, _ in items[i]))
        mix = list(zip(weights, (a for _, a in items[i]), strict=True))
        if episode_term and _off_mean(base["episode_return"][i], episode_mean[i]):
            mix.append((1.0, A_E[i]))
        advantage[i] = sum(w * a for w, a in mix) / sum(w for w, _ in mix) if mix else 0.0
    return {
        "episode_adv": episode_adv,
        "step_adv": step_adv,
        "advantage": advantage,
        "depths_used": used,
        "deepest_depth": deepest,
        "rounding_ties": rounding_ties,
    }


def _episode_means(episode_return, trajs, group_of, episode_stats):
    """{row: mean episode return of its group}, over trajectories (``"trajectory"``) or over step rows."""
    samples = defaultdict(list)  # group -> returns
    for traj, rows in trajs.items():
        for i in rows[:1] if episode_stats == "trajectory" else rows:
            samples[group_of[traj]].append(episode_return[i])
    means = {group: sum(values) / len(values) for group, values in samples.items()}
    return {i: means[group_of[traj]] for traj, rows in trajs.items() for i in rows}


def loop_graphgpo_terms(
    step_rewards,
    group_ids,
    traj_ids,
    step_ids,
    anchor_keys,
    won,
    action_valid=None,
    *,
    row_mask=None,
    gamma=0.95,
    norm="mean_std",
    epsilon=1e-6,
    episode_stats="trajectory",
    omega=0.1,
    success_reward=10.0,
    episode_advantage_w=1.0,
    step_advantage_w=1.0,
    invalid_penalty=0.0,
    progress=False,
):
    """GraphGPO: per group, edges s_t -> s_{t+1}, won last step -> SUCCESS, lost last step -> dead end; d = BFS
    distance to SUCCESS on reversed edges (unreachable, dead end: d_max + 1); R_G = r_succ omega^d(s_{t+1});
    A_G = norm(R_G within (u, s_t)), 0 in groups without a win; A = beta_E A_E + beta_G A_G."""
    n, valid, base, trajs, group_of = _common(
        step_rewards, group_ids, traj_ids, step_ids, anchor_keys, row_mask, gamma, norm, epsilon, episode_stats
    )
    A_E = base["episode_adv"]
    success = object()
    d_cur, d_next, R_G = [0.0] * n, [0.0] * n, [0.0] * n
    has_win = {}
    for u in set(group_of.values()):
        group_trajs = [rows for t, rows in trajs.items() if group_of[t] == u]
        into = defaultdict(set)  # node -> nodes with an edge into it
        for rows in group_trajs:
            for a, b in zip(rows, rows[1:], strict=False):
                into[anchor_keys[b]].add(anchor_keys[a])
            if won[rows[-1]]:
                into[success].add(anchor_keys[rows[-1]])
        has_win[u] = any(won[rows[-1]] for rows in group_trajs)
        dist = {success: 0} if has_win[u] else {}
        queue = deque([success] if has_win[u] else [])
        while queue:
            node = queue.popleft()
            for pred in into[node]:
                if pred not in dist:
                    dist[pred] = dist[node] + 1
                    queue.append(pred)
        d_max = max(dist.values(), default=0)
        for rows in group_trajs:
            for t, i in enumerate(rows):
                d_cur[i] = float(dist.get(anchor_keys[i], d_max + 1))
                if t + 1 < len(rows):
                    d_next[i] = float(dist.get(anchor_keys[rows[t + 1]], d_max + 1))
                else:
                    d_next[i] = 0.0 if won[i] else float(d_max + 1)
                exponent = d_next[i] - d_cur[i] + 1 if progress else d_next[i]
                invalid = 0.0 if action_valid is None or action_valid[i] else 1.0
                R_G[i] = success_reward * omega**exponent - invalid_penalty * invalid
    by_node = defaultdict(list)
    for i in range(n):
        if valid[i]:
            by_node[(group_ids[i], anchor_keys[i])].append((i, R_G[i]))
    step_adv = [0.0] * n
    for group in by_node.values():
        for i, a in _normalise(group, norm, epsilon).items():
            step_adv[i] = a if has_win[group_ids[i]] else 0.0
    advantage = [episode_advantage_w * A_E[i] + step_advantage_w * step_adv[i] for i in range(n)]
    return {
        "episode_adv": list(A_E),
        "step_adv": step_adv,
        "advantage": advantage,
        "distance": [d_cur[i] if valid[i] else 0.0 for i in range(n)],
        "next_distance": [d_next[i] if valid[i] else 0.0 for i in range(n)],
        "graph_return": [R_G[i] if valid[i] else 0.0 for i in range(n)],
    }


def loop_g2po_terms(
    step_rewards,
    group_ids,
    traj_ids,
    step_ids,
    anchor_keys,
    won,
    action_valid,
    *,
    row_mask=None,
    gamma=0.95,
    norm="mean_std",
    epsilon=1e-6,
    episode_stats="trajectory",
    success_reward=10.0,
    invalid_penalty=0.1,
    step_advantage_w=1.0,
):
    """G2PO: V(s) = mean over the group's rows at s of gamma^(T - t) R_tau; V'(t) = V(s_{t+1}) (last step:
    r_succ if won else 0); A_1 = norm(V' - c invalid within (u, s_t)); A_2 = norm(V' - V(s_t) over u);
    A = A_E + w (A_1 + A_2)."""
    n, valid, base, trajs, group_of = _common(
        step_rewards, group_ids, traj_ids, step_ids, anchor_keys, row_mask, gamma, norm, epsilon, episode_stats
    )
    A_E = base["episode_adv"]
    visits = defaultdict(list)  # (u, s) -> [gamma^(T - t) R_tau]
    for traj, rows in trajs.items():
        outcome = success_reward if won[rows[-1]] else 0.0
        for t, i in enumerate(rows):
            visits[(group_of[traj], anchor_keys[i])].append(gamma ** (len(rows) - t) * outcome)
    V = {node: sum(v) / len(v) for node, v in visits.items()}
    node_value, next_value = [0.0] * n, [0.0] * n
    by_node, by_group = defaultdict(list), defaultdict(list)
    for traj, rows in trajs.items():
        u = group_of[traj]
        for t, i in enumerate(rows):
            node_value[i] = V[(u, anchor_keys[i])]
            if t + 1 < len(rows):
                next_value[i] = V[(u, anchor_keys[rows[t + 1]])]
            else:
                next_value[i] = success_reward if won[i] else 0.0
            invalid = 0.0 if action_valid[i] else 1.0
            by_node[(u, anchor_keys[i])].append((i, next_value[i] - invalid_penalty * invalid))
            by_group[u].append((i, next_value[i] - node_value[i]))
    A_1, A_2 = [0.0] * n, [0.0] * n
    for group in by_node.values():
        for i, a in _normalise(group, norm, epsilon).items():
            A_1[i] = a
    for group in by_group.values():
        for i, a in _normalise(group, norm, epsilon).items():
            A_2[i] = a
    step_adv = [A_1[i] + A_2[i] for i in range(n)]
    return {
        "episode_adv": list(A_E),
        "step_adv": step_adv,
        "advantage": [A_E[i] + step_advantage_w * step_adv[i] for i in range(n)],
        "node_value": node_value,
        "next_value": next_value,
    }
