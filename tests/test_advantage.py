"""CPU tests of the GiGPO estimator (verl_gigpo.advantage).

Golden cases with the numbers worked out by hand, "reduces to" checks, permutation invariance, padding rows,
input validation, and equivalence with ``loop_gigpo_advantage`` — a plain dict-and-loop oracle
(``tests/helpers/gigpo_oracle.py``, shared with benchmarks/bench_advantage.py), the obvious implementation of the
maths — over hundreds of random batches.
"""

from __future__ import annotations

import math
import uuid

import numpy as np
import pytest
import torch
from gigpo_oracle import loop_gigpo_advantage, loop_gigpo_terms

from verl_gigpo.advantage import (
    STAT_NAMES,
    check_estimator_options,
    compute_gigpo_advantage,
    discounted_step_returns,
    gigpo_advantage_terms,
)
from verl_gigpo.advantage.anchors import anchor_group_ids
from verl_gigpo.config import GiGPOConfig

ATOL = 1e-5
RTOL = 1e-5


# ----------------------------------------------------------------------------------------------------------------
# the loop oracle: tests/helpers/gigpo_oracle.py (on pytest's pythonpath, see pyproject.toml)


# ----------------------------------------------------------------------------------------------------------------
# hand-computed golden case
#
# One episode group, gamma = 0.5, three trajectories (rows deliberately out of order in the batch):
#   tau1: rewards [0, 1],    anchors [s0, s1]      R_t = [0 + 0.5*1, 1]         = [0.5, 1]     return 1
#   tau2: rewards [0, 0, 1], anchors [s0, s2, s1]  R_t = [0.25, 0.5, 1]                        return 1
#   tau3: rewards [0],       anchors [s0]          R_t = [0]                                   return 0
# Episode level, episode_stats="trajectory": returns [1, 1, 0], mean 2/3, deviations [1/3, 1/3, -2/3],
#   unbiased var = (1/9 + 1/9 + 4/9) / 2 = 1/3, std = 0.5773503
#   mean_std: A_E = [0.5773503, 0.5773503, -1.1547005]     mean: A_E = [1/3, 1/3, -2/3]
# Episode level, episode_stats="step": row values [1, 1 | 1, 1, 1 | 0], mean 5/6, deviations 1/6 (x5), -5/6,
#   unbiased var = (5/36 + 25/36) / 5 = 1/6, std = 0.4082483
#   mean_std: A_E = 0.4082483 (tau1, tau2 rows), -2.0412415 (tau3)     mean: 1/6, -5/6
# Step level (anchor groups): s0 = {tau1 t0: 0.5, tau2 t0: 0.25, tau3 t0: 0}: mean 0.25, unbiased std 0.25
#   -> mean_std [1, 0, -1], mean [0.25, 0, -0.25];  s1 = {tau1 t1: 1, tau2 t2: 1}: equal -> [0, 0];
#   s2 = {tau2 t1} alone -> 0.

GOLDEN_ROWS = [  # (traj, step, reward, anchor) in batch order
    ("tau2", 2, 1.0, "s1"),
    ("tau1", 0, 0.0, "s0"),
    ("tau3", 0, 0.0, "s0"),
    ("tau2", 0, 0.0, "s0"),
    ("tau1", 1, 1.0, "s1"),
    ("tau2", 1, 0.0, "s2"),
]
GOLDEN_R_T = [1.0, 0.5, 0.0, 0.25, 1.0, 0.5]
GOLDEN_STEP_ADV = {"mean_std": [0.0, 1.0, -1.0, 0.0, 0.0, 0.0], "mean": [0.0, 0.25, -0.25, 0.0, 0.0, 0.0]}
_T, _S = 0.5773503, 0.4082483
GOLDEN_EPISODE_ADV = {
    ("mean_std", "trajectory"): [_T, _T, -2 * _T, _T, _T, _T],
    ("mean", "trajectory"): [1 / 3, 1 / 3, -2 / 3, 1 / 3, 1 / 3, 1 / 3],
    ("mean_std", "step"): [_S, _S, -5 * _S, _S, _S, _S],
    ("mean", "step"): [1 / 6, 1 / 6, -5 / 6, 1 / 6, 1 / 6, 1 / 6],
}


def _golden_inputs():
    traj, step, reward, anchor = zip(*GOLDEN_ROWS, strict=True)
    n = len(GOLDEN_ROWS)
    return (
        torch.tensor(reward),
        torch.ones(n, 4),
        np.array(["g"] * n, dtype=object),
        np.array(traj, dtype=object),
        np.array(step),
        np.array(anchor, dtype=object),
    )


@pytest.mark.parametrize("norm", ["mean_std", "mean"])
@pytest.mark.parametrize("episode_stats", ["trajectory", "step"])
def test_golden_case(norm, episode_stats):
    inputs = _golden_inputs()
    kwargs = {"gamma": 0.5, "norm": norm, "episode_stats": episode_stats, "step_advantage_w": 2.0, "epsilon": 1e-9}
    terms = gigpo_advantage_terms(*inputs, **kwargs)
    np.testing.assert_allclose(terms.step_return, GOLDEN_R_T, atol=1e-12)
    np.testing.assert_allclose(terms.episode_return, [1, 1, 0, 1, 1, 1], atol=1e-12)
    np.testing.assert_allclose(terms.episode_adv, GOLDEN_EPISODE_ADV[(norm, episode_stats)], atol=ATOL)
    np.testing.assert_allclose(terms.step_adv, GOLDEN_STEP_ADV[norm], atol=ATOL)
    expected = np.array(GOLDEN_EPISODE_ADV[(norm, episode_stats)]) + 2.0 * np.array(GOLDEN_STEP_ADV[norm])
    np.testing.assert_allclose(terms.advantage, expected, atol=ATOL)
    np.testing.assert_array_equal(terms.anchor_group_size, [2, 3, 3, 3, 2, 1])

    adv, ret = compute_gigpo_advantage(*inputs, gamma=0.5, norm=norm, episode_stats=episode_stats, step_advantage_w=2.0)
    assert adv.shape == (6, 4) and adv.dtype == torch.float32 and ret.dtype == torch.float32
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=torch.float32)[:, None].expand(6, 4))
    torch.testing.assert_close(ret, torch.tensor(GOLDEN_R_T)[:, None].expand(6, 4))


def test_golden_stats():
    stats = gigpo_advantage_terms(*_golden_inputs(), gamma=0.5).stats
    assert set(stats) == set(STAT_NAMES)
    assert all(type(v) is float for v in stats.values())
    assert stats["gigpo/num_episode_groups"] == 1.0
    assert stats["gigpo/num_step_groups"] == 3.0  # s0, s1, s2
    assert stats["gigpo/step_group_size_mean"] == 2.0  # 6 rows / 3 groups
    assert stats["gigpo/step_group_size_max"] == 3.0
    assert stats["gigpo/frac_singleton_step_groups"] == pytest.approx(1 / 3)
    assert stats["gigpo/frac_rows_in_singleton_step_groups"] == pytest.approx(1 / 6)
    assert stats["gigpo/frac_zero_std_episode_groups"] == 0.0
    assert stats["gigpo/episode_adv_abs_mean"] == pytest.approx((5 * _T + 2 * _T) / 6, abs=ATOL)
    assert stats["gigpo/step_adv_abs_mean"] == pytest.approx(2 / 6, abs=ATOL)  # |1| + |-1| over 6 rows
    assert stats["gigpo/frac_rows_nonzero_step_adv"] == pytest.approx(2 / 6)  # the same two rows
    assert stats["gigpo/num_masked_rows"] == 0.0


def test_singleton_and_constant_groups_get_zero():
    # Group "a": one trajectory (return 3) -> its episode term is 0 (the reference would give it 3).
    # Group "b": two trajectories with equal returns (2 and 2) -> 0, and the group counts as zero-std.
    # Group "c": returns 1 and 0 -> mean_std gives +-0.7071 (deviation 0.5 over unbiased std 0.7071).
    rewards = torch.tensor([1.0, 2.0, 2.0, 2.0, 1.0, 0.0])
    groups = np.array(["a", "a", "b", "b", "c", "c"])
    trajs = np.array([0, 0, 1, 2, 3, 4])
    steps = np.array([0, 1, 0, 0, 0, 0])
    anchors = np.array(["x", "y", "x", "x", "x", "x"])
    terms = gigpo_advantage_terms(rewards, torch.ones(6, 2), groups, trajs, steps, anchors, gamma=1.0)
    np.testing.assert_allclose(terms.episode_adv, [0, 0, 0, 0, 0.5 / math.sqrt(0.5), -0.5 / math.sqrt(0.5)], atol=ATOL)
    # steps: group a has anchors x (R=3) and y (R=2), each alone -> 0; b: x,x with R 2,2 -> 0; c: x,x with 1,0.
    np.testing.assert_allclose(terms.step_adv, [0, 0, 0, 0, 0.7071033, -0.7071033], atol=ATOL)
    assert terms.stats["gigpo/frac_zero_std_episode_groups"] == pytest.approx(2 / 3)
    assert terms.stats["gigpo/frac_singleton_step_groups"] == pytest.approx(2 / 4)
    # equal step returns (group b) leave no step signal: only c's two rows have one
    assert terms.stats["gigpo/frac_rows_nonzero_step_adv"] == pytest.approx(2 / 6)


def test_step_id_gaps_are_consecutive_steps():
    # Rows with step ids 10, 0, 3 and rewards 1, 2, 4. In step order the rewards are 2 (id 0), 4 (id 3), 1 (id 10),
    # three consecutive steps whatever the gaps: R(id 10) = 1, R(id 3) = 4 + 0.5 * 1, R(id 0) = 2 + 0.5 * 4 + 0.25 * 1.
    rewards = torch.tensor([1.0, 2.0, 4.0])
    terms = gigpo_advantage_terms(
        rewards, torch.ones(3, 1), np.zeros(3), np.zeros(3), np.array([10, 0, 3]), np.arange(3), gamma=0.5
    )
    np.testing.assert_allclose(terms.step_return, [1.0, 2 + 0.5 * 4 + 0.25 * 1, 4 + 0.5 * 1], atol=1e-12)


# ----------------------------------------------------------------------------------------------------------------
# reduces-to


def _random_batch(rng, *, n_groups=None, max_trajs=6, max_len=8, n_anchor_values=4, id_kind="int", pad=True):
    """A random batch in random row order: (inputs tuple, row_mask); padded rows are copies of real rows."""
    n_groups = n_groups or int(rng.integers(1, 5))
    rows = []
    traj_counter = 0
    for g in range(n_groups):
        for _ in range(int(rng.integers(1, max_trajs + 1))):
            length = int(rng.integers(1, max_len + 1))
            step_values = np.sort(rng.choice(3 * max_len, size=length, replace=False))  # gaps allowed
            for s in step_values:
                reward = float(rng.choice([0.0, 1.0, -0.1, rng.normal()]))
                anchor = int(rng.integers(n_anchor_values))
                rows.append((g, traj_counter, int(s), reward, anchor, True))
            traj_counter += 1
    if pad:
        for _ in range(int(rng.integers(0, 4))):  # verl-style padding: deep copies with extreme rewards
            g, t, s, _, a, _ = rows[int(rng.integers(len(rows)))]
            rows.append((g, t, s, float(rng.choice([1e30, -1e30, 7.0])), a, False))
    rows = [rows[i] for i in rng.permutation(len(rows))]
    g, t, s, r, a, valid = (list(col) for col in zip(*rows, strict=True))
    if id_kind == "str":
        names = {}
        g = [names.setdefault(("g", x), uuid.UUID(int=int(rng.integers(2**62))).hex) for x in g]
        t = [names.setdefault(("t", x), uuid.UUID(int=int(rng.integers(2**62))).hex) for x in t]
        a = [f"observation {x}" for x in a]
    elif id_kind == "tuple":
        a = [(x % 2, "room", x) for x in a]
    n = len(rows)
    mask = torch.ones(n, 5)
    mask[:, 3:] = torch.from_numpy(rng.random((n, 2)) < 0.5).float()
    inputs = (
        torch.tensor(r, dtype=torch.float32),
        mask,
        np.fromiter(g, dtype=object, count=n),
        np.fromiter(t, dtype=object, count=n),
        np.array(s),
        np.fromiter(a, dtype=object, count=n),
    )
    return inputs, np.array(valid)


def test_w_zero_gives_episode_term_alone():
    rng = np.random.default_rng(0)
    for _ in range(20):
        inputs, valid = _random_batch(rng)
        adv, _ = compute_gigpo_advantage(*inputs, row_mask=valid, step_advantage_w=0.0)
        terms = gigpo_advantage_terms(*inputs, row_mask=valid)
        expected = torch.from_numpy(terms.episode_adv.astype(np.float32))[:, None] * inputs[1]
        torch.testing.assert_close(adv, expected)
        rewards, _, groups, trajs, steps, anchors = inputs
        oracle = loop_gigpo_terms(rewards.tolist(), groups, trajs, steps, anchors, row_mask=valid)
        np.testing.assert_allclose(terms.episode_adv, oracle["episode_adv"], atol=ATOL, rtol=RTOL)


def test_all_distinct_anchors_give_zero_step_term():
    rng = np.random.default_rng(1)
    for _ in range(20):
        inputs, valid = _random_batch(rng, pad=False)
        distinct = np.arange(len(inputs[0]))  # every row its own anchor state
        terms = gigpo_advantage_terms(*inputs[:5], distinct)
        assert np.all(terms.step_adv == 0.0)
        np.testing.assert_array_equal(terms.advantage, terms.episode_adv)
        assert terms.stats["gigpo/frac_rows_in_singleton_step_groups"] == 1.0


def test_episode_stats_variants_on_equal_length_trajectories():
    # k trajectories of equal length L per group: both variants have the same mean, so norm="mean" agrees
    # exactly. With norm="mean_std" the unbiased std over k trajectories and over k*L rows differ, so the
    # advantages differ by the fixed factor std_traj / std_rows = sqrt((k*L - 1) / ((k - 1) * L)).
    rng = np.random.default_rng(2)
    k, length = 5, 4
    n = k * length
    rewards = torch.from_numpy(rng.normal(size=n).astype(np.float32))
    trajs = np.repeat(np.arange(k), length)
    args = (rewards, torch.ones(n, 1), np.zeros(n), trajs, np.tile(np.arange(length), k), np.arange(n) % 3)
    per_traj = gigpo_advantage_terms(*args, norm="mean", episode_stats="trajectory").episode_adv
    per_step = gigpo_advantage_terms(*args, norm="mean", episode_stats="step").episode_adv
    np.testing.assert_allclose(per_traj, per_step, atol=1e-12)
    per_traj = gigpo_advantage_terms(*args, episode_stats="trajectory", epsilon=1e-12).episode_adv
    per_step = gigpo_advantage_terms(*args, episode_stats="step", epsilon=1e-12).episode_adv
    np.testing.assert_allclose(per_step, per_traj * math.sqrt((n - 1) / ((k - 1) * length)), atol=1e-9)


def test_norm_mean_is_exact_difference():
    # norm="mean" is exactly x - mean: the anchor group {R = 0.5, 0.25, 0} of the golden case gives 0.25, 0, -0.25
    # whatever epsilon is.
    for eps in (1e-6, 0.5):
        terms = gigpo_advantage_terms(*_golden_inputs(), gamma=0.5, norm="mean", epsilon=eps)
        np.testing.assert_allclose(terms.step_adv, GOLDEN_STEP_ADV["mean"], atol=1e-12)


# ----------------------------------------------------------------------------------------------------------------
# oracle equivalence, permutation invariance, padding


@pytest.mark.parametrize("id_kind", ["int", "str", "tuple"])
def test_matches_loop_oracle_on_random_batches(id_kind):
    rng = np.random.default_rng({"int": 10, "str": 11, "tuple": 12}[id_kind])
    for trial in range(120):  # 360 batches over the three id kinds
        inputs, valid = _random_batch(rng, n_anchor_values=int(rng.integers(1, 6)), id_kind=id_kind)
        kwargs = {
            "gamma": float(rng.choice([1.0, 0.95, 0.5, float(rng.uniform(0.01, 1.0))])),
            "step_advantage_w": float(rng.choice([1.0, 0.0, 0.3])),
            "norm": ["mean_std", "mean"][trial % 2],
            "episode_stats": ["trajectory", "step"][(trial // 2) % 2],
            "epsilon": float(rng.choice([1e-6, 1e-3])),
        }
        row_mask = valid if trial % 5 else torch.from_numpy(valid)  # both mask types
        adv, ret = compute_gigpo_advantage(*inputs, row_mask=row_mask, **kwargs)
        adv_ref, ret_ref = loop_gigpo_advantage(*inputs, row_mask=valid, **kwargs)
        torch.testing.assert_close(adv, adv_ref, atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(ret, ret_ref, atol=ATOL, rtol=RTOL)
        assert torch.all(adv[~torch.from_numpy(valid)] == 0) and torch.all(ret[~torch.from_numpy(valid)] == 0)


def test_long_trajectory_matches_loop():
    rng = np.random.default_rng(3)
    n = 2000
    rewards = rng.normal(size=n)
    steps = rng.permutation(n)
    for gamma in (0.95, 0.999, 1.0):
        terms = gigpo_advantage_terms(
            torch.from_numpy(rewards), torch.ones(n, 1), np.zeros(n), np.zeros(n), steps, steps % 7, gamma=gamma
        )
        oracle = loop_gigpo_terms(rewards, [0] * n, [0] * n, list(steps), list(steps % 7), gamma=gamma)
        np.testing.assert_allclose(terms.step_return, oracle["step_return"], atol=1e-9, rtol=1e-9)
        np.testing.assert_allclose(terms.step_adv, oracle["step_adv"], atol=ATOL, rtol=RTOL)


def test_discounted_returns_very_long_segment():
    # 200,000 steps with gamma = 1: R_t is the reversed cumulative sum; no overflow or drift from gamma^-t tricks.
    rng = np.random.default_rng(4)
    r = rng.random(200_000)
    out = discounted_step_returns(r, np.zeros(r.size, dtype=np.int64), 1.0)
    np.testing.assert_allclose(out, np.cumsum(r[::-1])[::-1], rtol=1e-10)
    out = discounted_step_returns(r, np.zeros(r.size, dtype=np.int64), 0.5)
    np.testing.assert_allclose(out[-3:], [r[-3] + 0.5 * r[-2] + 0.25 * r[-1], r[-2] + 0.5 * r[-1], r[-1]])
    assert np.all(np.isfinite(out)) and out.max() < 2.0  # bounded by sum of 0.5^k * 1


@pytest.mark.parametrize("id_kind", ["int", "str"])
def test_permutation_invariance(id_kind):
    rng = np.random.default_rng(5)
    for _ in range(30):
        inputs, valid = _random_batch(rng, id_kind=id_kind)
        adv, ret = compute_gigpo_advantage(*inputs, row_mask=valid)
        stats = gigpo_advantage_terms(*inputs, row_mask=valid).stats
        perm = rng.permutation(len(valid))
        permuted = tuple(x[torch.from_numpy(perm)] if isinstance(x, torch.Tensor) else x[perm] for x in inputs)
        adv_p, ret_p = compute_gigpo_advantage(*permuted, row_mask=valid[perm])
        torch.testing.assert_close(adv_p, adv[torch.from_numpy(perm)], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(ret_p, ret[torch.from_numpy(perm)], atol=1e-6, rtol=1e-6)
        stats_p = gigpo_advantage_terms(*permuted, row_mask=valid[perm]).stats
        assert stats_p == pytest.approx(stats, abs=1e-9)


def test_padding_rows_change_nothing_and_get_zero():
    rng = np.random.default_rng(6)
    for _ in range(20):
        inputs, _ = _random_batch(rng, pad=False)
        n = len(inputs[0])
        copies = rng.integers(n, size=4)  # verl pads with deep copies of real rows (same traj id and step id)
        padded = tuple(
            torch.cat([x, x[torch.from_numpy(copies)]]) if isinstance(x, torch.Tensor) else np.r_[x, x[copies]]
            for x in inputs
        )
        padded[0][n:] = torch.tensor([1e30, -1e30, float("nan"), float("inf")])  # extreme and non-finite
        row_mask = np.r_[np.ones(n, bool), np.zeros(4, bool)]
        adv, ret = compute_gigpo_advantage(*inputs)
        adv_p, ret_p = compute_gigpo_advantage(*padded, row_mask=row_mask)
        torch.testing.assert_close(adv_p[:n], adv, atol=0, rtol=0)
        torch.testing.assert_close(ret_p[:n], ret, atol=0, rtol=0)
        assert torch.all(adv_p[n:] == 0) and torch.all(ret_p[n:] == 0)
        terms = gigpo_advantage_terms(*padded, row_mask=row_mask)
        assert terms.stats["gigpo/num_masked_rows"] == 4.0
        assert np.all(terms.anchor_group_size[n:] == 0) and np.all(terms.episode_return[n:] == 0)


def test_output_dtype_device_and_mask_kinds():
    inputs = _golden_inputs()
    expected, _ = compute_gigpo_advantage(*inputs, gamma=0.5)
    masks = [torch.ones(6, 4, dtype=dtype) for dtype in (torch.bool, torch.int64, torch.float64, torch.bfloat16)]
    for mask in masks:  # bfloat16 takes the torch path (numpy has no bfloat16), the others the numpy path
        adv, ret = compute_gigpo_advantage(inputs[0], mask, *inputs[2:], gamma=0.5)
        assert adv.dtype == ret.dtype == torch.float32 and adv.device == mask.device
        torch.testing.assert_close(adv, expected)
    mask = torch.ones(6, 4)
    mask[0, 2:] = 0  # response tokens only
    adv, ret = compute_gigpo_advantage(inputs[0], mask, *inputs[2:], gamma=0.5)
    assert torch.all(adv[0, 2:] == 0) and torch.all(ret[0, 2:] == 0) and ret[0, 0] == 1.0


def test_tuple_and_string_keys_give_same_partition():
    inputs = _golden_inputs()
    as_tuples = np.fromiter(((k, len(k)) for k in inputs[5]), dtype=object, count=6)
    as_ints = np.array([int(k[1:]) for k in inputs[5]])
    base = gigpo_advantage_terms(*inputs, gamma=0.5).advantage
    np.testing.assert_array_equal(gigpo_advantage_terms(*inputs[:5], as_tuples, gamma=0.5).advantage, base)
    np.testing.assert_array_equal(gigpo_advantage_terms(*inputs[:5], as_ints, gamma=0.5).advantage, base)
    as_list = [(k, len(k)) for k in inputs[5]]  # a list of tuples is kept as N keys, not an (N, 2) array
    np.testing.assert_array_equal(gigpo_advantage_terms(*inputs[:5], as_list, gamma=0.5).advantage, base)


def test_empty_and_all_masked_batches():
    adv, ret = compute_gigpo_advantage(torch.zeros(0), torch.zeros(0, 3), np.zeros(0), np.zeros(0), np.zeros(0), [])
    assert adv.shape == ret.shape == (0, 3)
    inputs = _golden_inputs()
    terms = gigpo_advantage_terms(*inputs, row_mask=np.zeros(6, bool))
    assert np.all(terms.advantage == 0) and np.all(terms.step_return == 0)
    assert terms.stats["gigpo/num_masked_rows"] == 6.0 and terms.stats["gigpo/num_step_groups"] == 0.0


# ----------------------------------------------------------------------------------------------------------------
# validation


def _call(**overrides):
    inputs = dict(
        zip(
            ["step_rewards", "response_mask", "group_ids", "traj_ids", "step_ids", "anchor_keys"],
            _golden_inputs(),
            strict=True,
        )
    )
    kwargs = {**inputs, **overrides}
    return compute_gigpo_advantage(**kwargs)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"group_ids": np.zeros(5)}, r"group_ids has 5 .*step_rewards has 6"),
        ({"traj_ids": np.zeros(7)}, r"traj_ids has 7 .*step_rewards has 6"),
        ({"step_ids": np.zeros(2, int)}, r"step_ids has 2 .*step_rewards has 6"),
        ({"anchor_keys": np.zeros(1)}, r"anchor_keys has 1 .*step_rewards has 6"),
        ({"response_mask": torch.ones(5, 4)}, r"response_mask has 5 .*step_rewards has 6"),
        ({"response_mask": torch.ones(6)}, r"response_mask .*2-D.*shape \(6,\)"),
        ({"step_rewards": torch.ones(6, 1)}, r"step_rewards must be 1-D"),
        (
            {"step_rewards": torch.tensor([0.0, 1.0, float("nan"), 0.0, float("inf"), 0.0])},
            r"step_rewards\[2\] = nan .*\b2 non-finite",
        ),
        ({"step_rewards": torch.tensor([0.0, 0.0, 0.0, 0.0, float("-inf"), 0.0])}, r"step_rewards\[4\] = -inf"),
        ({"norm": "mean_norm"}, r"norm='mean_norm'.*'mean_std'.*'mean'"),
        ({"episode_stats": "episode"}, r"episode_stats='episode'.*'trajectory'.*'step'"),
        ({"gamma": 1.5}, r"gamma=1\.5 .*\[0, 1\]"),
        ({"gamma": -0.1}, r"gamma=-0.1 must be"),
        ({"step_advantage_w": -1.0}, r"step_advantage_w=-1\.0 .*>= 0"),
        ({"epsilon": 0.0}, r"epsilon=0\.0 .*> 0"),
        ({"epsilon": -1e-6}, r"epsilon=-1e-06 must be"),
        ({"step_advantage_w": float("nan")}, r"step_advantage_w=nan .*finite"),
        ({"step_ids": np.array([2, 0, 0, 0, 1, 1.5])}, r"step_ids\[5\] = 1\.5 .*whole number"),
        ({"step_ids": np.array(["2", "0", "0", "0", "1", "1"])}, r"step_ids .*integers.*<U1"),
        ({"step_ids": np.array([2, 0, 0, 0, 0, 1])}, r"duplicate \(traj id, step id\).*rows 1 and 4"),
        (
            {"group_ids": np.array(["g", "g", "g", "g", "h", "g"], dtype=object)},
            r"traj_ids\[\d\] = 'tau1' .*two episode groups: '(g|h)' .*'(g|h)'",
        ),
        ({"row_mask": np.ones(6, dtype=int)}, r"row_mask .*bool.*int64"),
        ({"row_mask": torch.ones(6)}, r"row_mask .*bool.*torch\.float32"),
        ({"row_mask": np.ones(5, dtype=bool)}, r"row_mask .*shape \(6,\).*\(5,\)"),
        ({"row_mask": [True] * 6}, r"row_mask .*bool np\.ndarray or torch\.Tensor"),
        ({"anchor_keys": np.array(["a", None, "a", "a", "a", "a"], dtype=object)}, r"anchor_keys\[1\] is missing"),
        ({"traj_ids": np.array([1.0, np.nan, 1, 1, 1, 1])}, r"traj_ids\[1\] is missing"),
        (
            {"anchor_keys": np.array(["a", "b", ["x"], "a", "a", "a"], dtype=object)},
            r"anchor_keys\[2\] = \['x'\] is not",
        ),
        ({"anchor_keys": np.zeros((6, 2))}, r"anchor_keys .*1-D.*shape \(6, 2\)"),
    ],
)
def test_bad_input_raises(overrides, match):
    with pytest.raises(ValueError, match=match):
        _call(**overrides)


# ----------------------------------------------------------------------------------------------------------------
# numerics: overflow, step ids beyond int64, non-finite masks, gamma = 0


def _one_group(rewards, steps=None, traj=None):
    n = len(rewards)
    return (
        torch.tensor(rewards, dtype=torch.float64),
        torch.ones(n, 2),
        np.zeros(n, dtype=int),
        np.arange(n) if traj is None else np.asarray(traj),
        np.zeros(n, dtype=int) if steps is None else steps,
        np.array(["s"] * n, dtype=object),
    )


def test_finite_rewards_that_overflow_raise():
    # Each reward is finite, but the group mean sums 1e308 + 1e308: inf - inf = NaN advantages before this check.
    with pytest.raises(ValueError, match=r"advantage of row 0 .*float64 \(nan\)"):
        compute_gigpo_advantage(*_one_group([1e308, 1e308, -1e308, 0.0]))
    # One trajectory of two 1e308 steps: its episode return is inf.
    with pytest.raises(ValueError, match=r"episode return of row 0 .*float64 \(inf\)"):
        compute_gigpo_advantage(*_one_group([1e308, 1e308], steps=np.arange(2), traj=[0, 0]))
    # Fits float64 but not the float32 output tensors.
    with pytest.raises(ValueError, match=r"R_t of row 0 \(1e\+200\).*float32"):
        compute_gigpo_advantage(*_one_group([1e200, 0.0]))


@pytest.mark.parametrize(
    "steps",
    [
        np.array([2**63 - 1, 2**63], dtype=np.uint64),  # wraps to [2^63 - 1, -2^63]: the order would reverse
        np.array([1e20, 1.0]),
        np.array([2**64, 0], dtype=object),
    ],
)
def test_step_ids_beyond_int64_raise(steps):
    with pytest.raises(ValueError, match=r"step_ids\[\d\] = \S+ .*int64 range"):
        compute_gigpo_advantage(*_one_group([1.0, 0.0], steps=steps, traj=[0, 0]))


def test_large_integer_step_ids_keep_their_order():
    # 2^60 and 2^60 + 1 are the same float64: they must not go through float (a false duplicate before).
    steps = np.array([2**60 + 1, 2**60], dtype=object)
    terms = gigpo_advantage_terms(*_one_group([1.0, 2.0], steps=steps, traj=[0, 0]), gamma=0.5)
    np.testing.assert_allclose(terms.step_return, [1.0, 2.0 + 0.5 * 1.0])  # row 1 (2^60) is the first step


def test_non_finite_response_mask_raises():
    inputs = list(_golden_inputs())
    inputs[1] = inputs[1].clone()
    inputs[1][1, 0] = float("nan")
    with pytest.raises(ValueError, match=r"response_mask\[1, 0\] = nan .*float32"):
        compute_gigpo_advantage(*inputs)
    inputs[1] = torch.ones(6, 4, dtype=torch.float64)
    inputs[1][2, 3] = 1e39  # finite in float64, inf in the float32 output
    with pytest.raises(ValueError, match=r"response_mask\[2, 3\] = 1e\+39 .*float32"):
        compute_gigpo_advantage(*inputs)


def test_gamma_zero_gives_the_step_reward():
    # gamma = 0 is a valid discount: R_t = r_t (accepted by the estimator and by GiGPOConfig alike).
    inputs = _golden_inputs()
    terms = gigpo_advantage_terms(*inputs, gamma=0)
    np.testing.assert_array_equal(terms.step_return, inputs[0].double().numpy())
    assert GiGPOConfig(gamma=0).estimator_kwargs()["gamma"] == 0.0


@pytest.mark.parametrize(
    "options",
    [
        {"gamma": -0.5},
        {"gamma": 1.01},
        {"gamma": "0.9"},
        {"gamma": float("nan")},
        {"step_advantage_w": -1.0},
        {"step_advantage_w": float("inf")},
        {"step_advantage_w": True},
        {"epsilon": 0.0},
        {"norm": "mean_norm"},
        {"episode_stats": "episode"},
        # the similarity threshold: GiGPOConfig had its own check, with another message than anchors' and the
        # estimator had none (the plug-in's estimator function ignored key_mode=similarity altogether)
        {"similarity_threshold": 0.0},
        {"similarity_threshold": 1.5},
        {"similarity_threshold": float("nan")},
        {"similarity_threshold": True},
        {"similarity_threshold": "0.9"},
    ],
)
def test_config_and_estimator_share_one_option_check(options):
    # One validator: the same value is rejected by both, with the same message.
    defaults = {
        "gamma": 0.95,
        "step_advantage_w": 1.0,
        "norm": "mean_std",
        "epsilon": 1e-6,
        "episode_stats": "trajectory",
    }
    with pytest.raises(ValueError) as direct:
        check_estimator_options(**{**defaults, **options})
    with pytest.raises(ValueError) as from_config:
        GiGPOConfig(**options)
    with pytest.raises(ValueError) as from_estimator:
        compute_gigpo_advantage(*_golden_inputs(), **options)
    assert str(from_config.value) == str(from_estimator.value) == str(direct.value)
    if "similarity_threshold" in options:  # and the grouping functions say the same
        with pytest.raises(ValueError) as from_anchors:
            anchor_group_ids(["a", "b"], ["g", "g"], options["similarity_threshold"])
        assert str(from_anchors.value) == str(direct.value)
        assert str(direct.value).startswith(f"similarity_threshold={options['similarity_threshold']!r} must be")


# ----------------------------------------------------------------------------------------------------------------
# similarity keys (similarity_threshold; GiGPOConfig(key_mode="similarity"))

ROOM = (
    "You arrive at countertop 1. On the countertop 1, you see a apple 1, a bread 2, a butterknife 3, a cup 1, "
    "a dishsponge 2, a fork 1, a lettuce 2, a peppershaker 1, a plate 2, a saltshaker 3, and a spatula 1."
)
ROOM_VARIANTS = [  # Dice similarity of the 5-byte shingle sets to ROOM: ~0.97-0.99, to each other >= 0.93
    ROOM,
    ROOM.replace("apple 1", "apple 2"),
    ROOM.replace("bread 2", "egg 2"),
    ROOM.replace("lettuce", "tomato"),
]
OTHERS = ["You are facing the drawer 4. The drawer 4 is closed.", "Nothing happens.", "You open the fridge 1."]


def _similarity_batch(rng, n_groups=3, members=4, max_len=4):
    rows = []
    for g in range(n_groups):
        for m in range(members):
            for t in range(int(rng.integers(1, max_len + 1))):
                texts = ROOM_VARIANTS if rng.random() < 0.6 else OTHERS
                rows.append((f"g{g}", f"g{g}m{m}", t, texts[int(rng.integers(len(texts)))], float(rng.normal())))
    perm = rng.permutation(len(rows))
    g, tr, st, key, r = (np.array(col, dtype=object) for col in zip(*[rows[i] for i in perm], strict=True))
    return torch.tensor(r.astype(float)), torch.ones(len(rows), 2), g, tr, st.astype(int), key


def test_similarity_keys_match_the_loop_oracle():
    rng = np.random.default_rng(7)
    merged = 0
    for _ in range(20):
        inputs = _similarity_batch(rng)
        valid = rng.random(len(inputs[0])) < 0.9
        for threshold in (0.9, 0.5):
            terms = gigpo_advantage_terms(*inputs, row_mask=valid, gamma=0.9, similarity_threshold=threshold)
            oracle = loop_gigpo_terms(
                inputs[0].tolist(), *map(list, inputs[2:]), row_mask=valid, gamma=0.9, similarity_threshold=threshold
            )
            np.testing.assert_allclose(terms.step_adv, oracle["step_adv"], atol=ATOL, rtol=RTOL)
            np.testing.assert_allclose(terms.advantage, oracle["advantage"], atol=ATOL, rtol=RTOL)
            exact = gigpo_advantage_terms(*inputs, row_mask=valid, gamma=0.9)
            merged += exact.stats["gigpo/num_step_groups"] > terms.stats["gigpo/num_step_groups"]
    assert merged == 40  # the variants of the room merged every time: the test compares two real partitions


def test_similarity_threshold_one_is_exact_keys_and_other_texts_stay_apart():
    inputs = _similarity_batch(np.random.default_rng(1))
    exact = gigpo_advantage_terms(*inputs)
    np.testing.assert_array_equal(gigpo_advantage_terms(*inputs, similarity_threshold=1.0).advantage, exact.advantage)
    # A variant of the room in one group and ROOM in another are never compared: groups stay apart.
    rows = (torch.tensor([1.0, 0.0]), torch.ones(2, 1), ["g0", "g1"], ["a", "b"], [0, 0], ROOM_VARIANTS[:2])
    assert gigpo_advantage_terms(*rows, similarity_threshold=0.9).stats["gigpo/num_step_groups"] == 2.0


def test_similarity_keys_must_be_texts():
    inputs = list(_golden_inputs())
    inputs[5] = np.array(["s0", "s1", 3, "s0", "s1", "s2"], dtype=object)
    with pytest.raises(ValueError, match=r"anchor_keys\[2\] = 3 .*int.*key_mode='observation'"):
        gigpo_advantage_terms(*inputs, similarity_threshold=0.9)
    mask = np.array([True, True, False, True, True, True])  # a masked row is not looked at
    gigpo_advantage_terms(*inputs, row_mask=mask, similarity_threshold=0.9)


def test_config_advantage_terms_is_the_estimator_with_its_settings():
    inputs = _similarity_batch(np.random.default_rng(3))
    for cfg, threshold in [
        (GiGPOConfig(gamma=0.5, norm="mean", key_mode="observation"), None),
        (GiGPOConfig(step_advantage_w=0.5, key_mode="similarity", similarity_threshold=0.8), 0.8),
    ]:
        got = cfg.advantage_terms(*inputs)
        want = gigpo_advantage_terms(*inputs, similarity_threshold=threshold, **cfg.estimator_kwargs())
        np.testing.assert_array_equal(got.advantage, want.advantage)
        assert got.stats == want.stats


def test_duplicates_allowed_when_masked():
    inputs = _golden_inputs()
    padded = (torch.cat([inputs[0], inputs[0][:1]]), torch.ones(7, 4)) + tuple(np.r_[x, x[:1]] for x in inputs[2:])
    with pytest.raises(ValueError, match=r"duplicate \(traj id, step id\).*rows 0 and 6"):
        compute_gigpo_advantage(*padded, gamma=0.5)
    adv, _ = compute_gigpo_advantage(*padded, gamma=0.5, row_mask=np.r_[np.ones(6, bool), False])
    torch.testing.assert_close(adv[:6], compute_gigpo_advantage(*inputs, gamma=0.5)[0])


def test_constant_groups_are_exactly_zero():
    # Three trajectories with return 0.1 each: the float mean is 0.10000000000000002, so a plain (x - mean) / (std
    # + eps) would give about -1e-11 instead of 0. Groups whose members are all equal get exactly 0.
    n = 3
    rewards = torch.full((n,), 0.1, dtype=torch.float64)
    for norm in ("mean_std", "mean"):
        terms = gigpo_advantage_terms(
            rewards, torch.ones(n, 1), np.zeros(n), np.arange(n), np.zeros(n, int), np.zeros(n), norm=norm
        )
        assert np.all(terms.episode_adv == 0.0) and np.all(terms.step_adv == 0.0)
        assert terms.stats["gigpo/frac_zero_std_episode_groups"] == 1.0
