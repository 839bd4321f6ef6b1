"""The GiGPO loop oracle: the maths of ``verl_gigpo.advantage`` written the slow, obvious way (dicts and loops).

Shared by the tests (``tests/test_advantage.py``, ``tests/test_anchors.py``, ``tests/test_verl_plugin.py``) and
by ``benchmarks/bench_advantage.py``. ``tests/`` is no package (verl's wheel installs a top-level ``tests``), so
load this file by path::

    spec = importlib.util.spec_from_file_location("gigpo_oracle", path_to_this_file)

It imports nothing from ``verl_gigpo`` except :func:`verl_gigpo.advantage.anchors.shingle_similarity`, the reference
definition of the similarity of two observation texts.

Notation as in ``verl_gigpo/advantage.py``: ``R(tau) = sum_t r_t``, ``R_t = r_t + gamma * R_{t+1}`` in step-id
order, ``A_E = (R(tau) - mean_G) / (std_G + eps)`` over episode groups G, ``A_S = (R_t - mean_S) / (std_S + eps)``
over anchor groups S = (episode group, anchor key), ``A = A_E + w * A_S``; unbiased std; a group of one gets 0.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import torch

from verl_gigpo.advantage.anchors import shingle_similarity

__all__ = ["brute_force_similarity_groups", "loop_gigpo_advantage", "loop_gigpo_terms"]


def brute_force_similarity_groups(texts, threshold):
    """All pairs, union-find: texts are linked when identical or ``shingle_similarity >= threshold``.

    Returns a list with the smallest index of each text's connected component (equal values = same group).
    """
    parent = list(range(len(texts)))

    def find(x):
        while parent[x] != x:
            x = parent[x]
        return x

    for i in range(len(texts)):
        for j in range(i + 1, len(texts)):
            if texts[i] == texts[j] or shingle_similarity(texts[i], texts[j]) >= threshold:
                ri, rj = find(i), find(j)
                parent[max(ri, rj)] = min(ri, rj)
    return [find(i) for i in range(len(texts))]


def loop_gigpo_terms(
    step_rewards,
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
):
    """Plain-Python GiGPO: a dict of per-row lists (episode_return, step_return, episode_adv, step_adv, advantage);
    masked rows get 0.

    ``similarity_threshold`` (None = exact keys): the valid rows' anchor texts of each episode group are first
    replaced by their component in :func:`brute_force_similarity_groups` (texts of different groups are never
    compared).
    """
    n = len(step_rewards)
    rewards = [float(x) for x in step_rewards]
    valid = [True] * n if row_mask is None else [bool(v) for v in row_mask]
    keys = list(anchor_keys)
    if similarity_threshold is not None:
        rows_of_group = defaultdict(list)
        for i in range(n):
            if valid[i]:
                rows_of_group[group_ids[i]].append(i)
        for rows in rows_of_group.values():
            component = brute_force_similarity_groups([anchor_keys[i] for i in rows], similarity_threshold)
            for i, c in zip(rows, component, strict=True):
                keys[i] = ("component", c)

    rows_of_traj = defaultdict(list)
    group_of_traj = {}
    for i in range(n):
        if valid[i]:
            rows_of_traj[traj_ids[i]].append(i)
            group_of_traj[traj_ids[i]] = group_ids[i]

    episode_return = [0.0] * n
    step_return = [0.0] * n
    total_of_traj = {}
    for traj, rows in rows_of_traj.items():
        rows = sorted(rows, key=lambda i: int(step_ids[i]))
        total = sum(rewards[i] for i in rows)
        total_of_traj[traj] = total
        running = 0.0
        for i in reversed(rows):  # R_t = r_t + gamma * R_{t+1}
            running = rewards[i] + gamma * running
            step_return[i] = running
            episode_return[i] = total

    def normalise(groups):
        """groups: {group: [(member, value), ...]} -> {member: normalised value}."""
        out = {}
        for members in groups.values():
            values = [v for _, v in members]
            k = len(values)
            if k == 1:
                out[members[0][0]] = 0.0
                continue
            mean = sum(values) / k
            std = math.sqrt(sum((v - mean) ** 2 for v in values) / (k - 1))
            for member, v in members:
                out[member] = (v - mean) / (std + epsilon) if norm == "mean_std" else v - mean
        return out

    episode_adv = [0.0] * n
    if episode_stats == "trajectory":
        by_group = defaultdict(list)
        for traj, total in total_of_traj.items():
            by_group[group_of_traj[traj]].append((traj, total))
        adv_of_traj = normalise(by_group)
        for i in range(n):
            if valid[i]:
                episode_adv[i] = adv_of_traj[traj_ids[i]]
    else:
        by_group = defaultdict(list)
        for i in range(n):
            if valid[i]:
                by_group[group_ids[i]].append((i, episode_return[i]))
        adv_of_row = normalise(by_group)
        for i, a in adv_of_row.items():
            episode_adv[i] = a

    by_anchor = defaultdict(list)
    for i in range(n):
        if valid[i]:
            by_anchor[(group_ids[i], keys[i])].append((i, step_return[i]))
    step_adv = [0.0] * n
    for i, a in normalise(by_anchor).items():
        step_adv[i] = a

    advantage = [episode_adv[i] + step_advantage_w * step_adv[i] for i in range(n)]
    return {
        "episode_return": episode_return,
        "step_return": step_return,
        "episode_adv": episode_adv,
        "step_adv": step_adv,
        "advantage": advantage,
    }


def loop_gigpo_advantage(
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
):
    """Loop oracle with the signature of compute_gigpo_advantage: ``(advantages, returns)``, float32 (N, L)."""
    terms = loop_gigpo_terms(
        [float(x) for x in step_rewards],
        list(group_ids),
        list(traj_ids),
        list(step_ids),
        list(anchor_keys),
        row_mask=None if row_mask is None else list(np.asarray(row_mask)),
        gamma=gamma,
        step_advantage_w=step_advantage_w,
        norm=norm,
        epsilon=epsilon,
        episode_stats=episode_stats,
        similarity_threshold=similarity_threshold,
    )
    mask = response_mask.to(torch.float32)
    adv = torch.tensor(terms["advantage"], dtype=torch.float32).unsqueeze(-1) * mask
    ret = torch.tensor(terms["step_return"], dtype=torch.float32).unsqueeze(-1) * mask
    return adv, ret
