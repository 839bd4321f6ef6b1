"""CPU tests of the step-credit successors HGPO, GraphGPO and G2PO (verl_gigpo.advantage.{hgpo,graphgpo,g2po}).

Hand-computed golden cases (the arithmetic in the comments), "reduces to" checks against GiGPO, permutation
invariance, input validation, and equivalence with the loop oracles of ``tests/helpers/successor_oracles.py``
(written straight from the equations) over many random batches: revisits, singletons, groups without a win,
verl-style padding copies, failed episodes, step-id gaps and shuffled rows.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from successor_oracles import loop_g2po_terms, loop_graphgpo_terms, loop_hgpo_terms

from verl_gigpo.advantage import (
    ESTIMATOR_TERMS,
    G2PO_STAT_NAMES,
    GRAPHGPO_STAT_NAMES,
    HGPO_STAT_NAMES,
    STAT_NAMES,
    g2po_advantage_terms,
    gigpo_advantage_terms,
    graphgpo_advantage_terms,
    hgpo_advantage_terms,
)

ATOL = 1e-6

# ----------------------------------------------------------------------------------------------------------------
# golden cases: one episode group, three trajectories (rows deliberately out of order in the batch)
#
#   tau1 (won):  anchors A, B        rewards 0, 1      R_t (gamma 0.5) = 0.5, 1      return 1
#   tau2 (lost): anchors A, C        rewards 0, 0      R_t = 0, 0                    return 0
#   tau3 (lost): anchors A, B, C     rewards 0, 0, 0   R_t = 0, 0, 0                 return 0
#
# A_E (trajectory statistics): returns 1, 0, 0 -> mean 1/3, deviations 2/3, -1/3, -1/3, unbiased variance
#   (4/9 + 1/9 + 1/9) / 2 = 1/3, std 0.5773503 -> A_E = 1.1547005 (tau1), -0.5773503 (tau2, tau3).

GOLDEN = [  # (traj, step, anchor, reward, valid action) in batch order
    ("t3", 2, "C", 0.0, True),
    ("t1", 0, "A", 0.0, True),
    ("t2", 1, "C", 0.0, True),
    ("t3", 0, "A", 0.0, True),
    ("t1", 1, "B", 1.0, True),
    ("t2", 0, "A", 0.0, False),
    ("t3", 1, "B", 0.0, True),
]
WON = {"t1": True, "t2": False, "t3": False}
_E = 0.5773503
A_E_GOLDEN = [-_E, 2 * _E, -_E, -_E, 2 * _E, -_E, -_E]


def _golden(**kw):
    traj, step, anchor, reward, valid = (list(x) for x in zip(*GOLDEN, strict=True))
    n = len(GOLDEN)
    inputs = (
        torch.tensor(reward),
        torch.ones(n, 2),
        np.zeros(n, dtype=int),
        np.array(traj, dtype=object),
        np.array(step),
        np.array(anchor, dtype=object),
    )
    extra = {"won": np.array([WON[t] for t in traj]), "action_valid": np.array(valid)}
    return inputs, {**extra, "gamma": 0.5, **kw}


def test_hgpo_golden():
    # K = 1: depths 1 (same anchor) and 2 (same previous and current anchor).
    # depth 1: A = {t1 0.5, t2 0, t3 0}: mean 1/6, deviations 1/3, -1/6, -1/6, var (1/9 + 1/36 + 1/36) / 2 = 1/12,
    #            std 0.2886751 -> 1.1547005, -0.5773503, -0.5773503
    #          B = {t1 1, t3 0}: mean 0.5, std 0.7071068 -> +0.7071068, -0.7071068
    #          C = {t2 0, t3 0}: equal -> 0 (not in V)
    # depth 2 (steps with a previous step): (A, B) = {t1 1, t3 0} -> +-0.7071068; (A, C) = {t2 0} alone;
    #          (B, C) = {t3 0} alone
    # mix, w_k = k: t1 step 1: (1 * 0.7071068 + 2 * 0.7071068) / 3 = 0.7071068; t3 step 1: -0.7071068;
    #          step 0 rows: depth 1 only; C rows: V empty -> 0
    inputs, kw = _golden()
    terms = hgpo_advantage_terms(*inputs, gamma=0.5, history_length=1)
    expected = [0.0, 2 * _E, 0.0, -_E, 0.7071068, -_E, -0.7071068]
    np.testing.assert_allclose(terms.advantage, expected, atol=1e-5)
    np.testing.assert_allclose(terms.step_adv, expected, atol=1e-5)
    np.testing.assert_array_equal(terms.extras["depths_used"], [0, 1, 0, 1, 2, 1, 2])
    np.testing.assert_array_equal(terms.extras["deepest_depth"], [0, 1, 0, 1, 2, 1, 2])
    assert np.all(terms.episode_adv == 0)  # no episode term by default (the paper)
    # episode_term: A_E joins with weight 1. t1 step 0: (1.1547005 + 1.1547005) / 2; t2 step 1 (C, V empty):
    # A_E alone = -0.5773503; t1 step 1: (0.7071068 + 2 * 0.7071068 + 1.1547005) / 4 = 0.8189552
    mixed = hgpo_advantage_terms(*inputs, gamma=0.5, history_length=1, episode_term=True)
    np.testing.assert_allclose(mixed.advantage[[1, 2, 4]], [2 * _E, -_E, (3 * 0.7071068 + 2 * _E) / 4], atol=1e-5)
    np.testing.assert_allclose(mixed.episode_adv, A_E_GOLDEN, atol=1e-5)


def test_hgpo_weight_base_and_population_std():
    # Two depths that disagree: t1 step 1 sits in B = {t1 1, t3 0, t4 1} (depth 1) and (A, B) = {t1 1, t3 0}.
    # Here depth 1: mean 2/3, deviations 1/3, -2/3, 1/3, unbiased var 1/3 -> a_1 = 0.5773503 for t1;
    # depth 2: a_2 = 0.7071068. weight_base "depth": (1 a_1 + 2 a_2) / 3 = 0.6638546;
    # "depth_plus_one": (2 a_1 + 3 a_2) / 5 = 0.6552042. Population std: a_1 = (1/3) / sqrt(2/9) = 0.7071068,
    # a_2 = 0.5 / 0.5 = 1 -> (0.7071068 + 2) / 3 = 0.9023689.
    inputs, _ = _golden()
    rewards, mask, groups, traj, step, anchor = inputs
    more = (
        torch.cat([rewards, torch.tensor([1.0, 0.0])]),
        torch.ones(9, 2),
        np.zeros(9, dtype=int),
        np.r_[traj, ["t4", "t4"]].astype(object),
        np.r_[step, [1, 0]],
        np.r_[anchor, ["B", "D"]].astype(object),
    )
    t1_step1 = 4
    for base, std, expected in (("depth", "unbiased", 0.6638546), ("depth_plus_one", "unbiased", 0.6552042)):
        terms = hgpo_advantage_terms(*more, gamma=0.5, history_length=1, weight_base=base, std=std)
        assert terms.advantage[t1_step1] == pytest.approx(expected, abs=1e-5)
    terms = hgpo_advantage_terms(*more, gamma=0.5, history_length=1, std="population")
    assert terms.advantage[t1_step1] == pytest.approx(0.9023689, abs=1e-5)


def _rows(rewards, traj, anchors):
    """The six per-row inputs of one episode group "u" whose trajectories' steps are numbered 0, 1, ... in order."""
    step = [traj[:i].count(t) for i, t in enumerate(traj)]
    n = len(rewards)
    return np.array(rewards), torch.ones(n, 1), ["u"] * n, traj, step, anchors


def test_hgpo_depths_by_the_exact_rule():
    # t2 sits at its groups' mean, which floats miss by a remainder. gamma 1, K = 1;
    # R_t = 0.1, 0.1 (t1), 0.2, 0.2 (t2), 0.3, 0.3 (t3), 1, 1 (t4).
    # depth 1: B (step 0 of t1-t3) = {0.1, 0.2, 0.3}: mean 0.2, unbiased std 0.1; C (t4 step 0) alone;
    #          A (step 1) = {0.1, 0.2, 0.3, 1}: mean 0.4, deviations -0.3, -0.2, -0.1, 0.6, var 0.5 / 3,
    #          std 0.4082483 -> -0.7348469, -0.4898979, -0.2449490, 1.4696938
    # depth 2: (B, A) = {0.1, 0.2, 0.3} again; (C, A) = {t4} alone.
    # t2's R_t is its groups' mean at both steps: in floats 0.2 - mean(0.1, 0.2, 0.3) = -2.8e-17, which a_k != 0
    # would keep (t2 step 1: (-0.4898979 + 2 * -2.8e-16) / 3 = -0.1633, two depths). Exactly it is 0:
    # t2 step 0 has no depth (0), t2 step 1 only depth 1 (-0.4898979).
    # t1 step 1: (1 * -0.7348469 + 2 * -0.99999) / 3 = -0.9116156; t3 step 1: (-0.2449490 + 2 * 0.99999) / 3
    # = 0.5850103 (0.99999 = 0.1 / (0.1 + 1e-6)). norm "mean": a = x - mean, t1 step 1 (-0.3 + 2 * -0.1) / 3.
    assert sum([0.1, 0.2, 0.3]) / 3 != 0.2  # the float remainder this case is about
    inputs = _rows([0, 0.1, 0, 0.2, 0, 0.3, 0, 1.0], ["t1", "t1", "t2", "t2", "t3", "t3", "t4", "t4"], list("BABABACA"))
    e, a = 0.1 / (0.1 + 1e-6), np.array([-0.3, -0.2, -0.1, 0.6]) / (np.sqrt(0.5 / 3) + 1e-6)  # depth 1 of A
    expected = {
        "mean_std": [-e, (a[0] - 2 * e) / 3, 0, a[1], e, (a[2] + 2 * e) / 3, 0, a[3]],
        "mean": [-0.1, -0.5 / 3, 0, -0.2, 0.1, 0.1 / 3, 0, 0.6],
    }
    for norm, values in expected.items():
        terms = hgpo_advantage_terms(*inputs, gamma=1.0, history_length=1, alpha=1.0, norm=norm)
        np.testing.assert_allclose(terms.advantage, values, rtol=1e-12, atol=1e-15, err_msg=norm)
        np.testing.assert_array_equal(terms.extras["depths_used"], [1, 2, 0, 1, 1, 2, 0, 1], err_msg=norm)
        assert terms.advantage[2] == 0.0  # no depth: exactly 0, not a remainder


def test_hgpo_returns_equal_up_to_rounding_keep_no_depth():
    # One anchor A at step 0 of two trajectories, gamma 1: R_0 = 0.1 + 0.2 = 0.30000000000000004 (t1) and
    # 0.3 + 0 = 0.3 (t2), equal in exact arithmetic. Both norms: no depth, advantage exactly 0 (a_k != 0 kept
    # t2's depth 1: its float mean is t1's R_0, and 0.3 - 0.30000000000000004 = -5.6e-17 is not 0).
    # Steps 1 (B, C) are singletons. 1e-9 apart (t2: 0.3 + 2e-9) they differ: depth 1 is kept on both rows,
    # a = -+1e-9 ("mean") and -+1e-9 / (1.4142136e-9 + 1e-6) = -+0.000999 ... ("mean_std", std 1.4142136e-9).
    assert 0.1 + 0.2 != 0.3
    traj, anchors = ["t1", "t1", "t2", "t2"], ["A", "B", "A", "C"]
    for norm in ("mean_std", "mean"):
        equal = hgpo_advantage_terms(*_rows([0.1, 0.2, 0.3, 0.0], traj, anchors), gamma=1.0, norm=norm)
        np.testing.assert_array_equal(equal.extras["depths_used"], [0, 0, 0, 0], err_msg=norm)
        np.testing.assert_array_equal(equal.advantage, [0, 0, 0, 0], err_msg=norm)
        assert equal.stats["hgpo/frac_rows_without_group"] == 1.0
        apart = hgpo_advantage_terms(*_rows([0.1, 0.2, 0.3 + 2e-9, 0.0], traj, anchors), gamma=1.0, norm=norm)
        np.testing.assert_array_equal(apart.extras["depths_used"], [1, 0, 1, 0], err_msg=norm)
        a = 1e-9 if norm == "mean" else 1e-9 / (np.sqrt(2) * 1e-9 + 1e-6)
        np.testing.assert_allclose(apart.advantage, [-a, 0, a, 0], rtol=1e-5, atol=0, err_msg=norm)


def test_hgpo_episode_item_by_the_exact_rule():
    # episode_term: A_E joins when the episode return is off its group's mean. gamma 0.5; t1 rewards 0.1, 0.2
    # (anchors A, B), t2 0.3, 0 (A, C): episode returns 0.30000000000000004 and 0.3, equal exactly, so A_E is no
    # item (a_k != 0 on A_E made it one, halving the depth item). R_0 = 0.1 + 0.5 * 0.2 = 0.2 (t1), 0.3 (t2):
    # depth 1 of A = -+0.7071068 ("mean_std", std 0.0707107) or -+0.05 ("mean"); steps 1 are singletons.
    # With both episode statistics (over trajectories or over step rows) the rows keep the depth item alone.
    inputs = _rows([0.1, 0.2, 0.3, 0.0], ["t1", "t1", "t2", "t2"], ["A", "B", "A", "C"])
    for norm, a in (("mean_std", 0.05 / (0.05 * np.sqrt(2) + 1e-6)), ("mean", 0.05)):
        for stats in ("trajectory", "step"):
            terms = hgpo_advantage_terms(*inputs, gamma=0.5, norm=norm, episode_stats=stats, episode_term=True)
            np.testing.assert_allclose(terms.advantage, [-a, 0, a, 0], rtol=1e-12, atol=0, err_msg=(norm, stats))
            np.testing.assert_allclose(np.abs(terms.episode_adv), 0.0, atol=1e-10)  # a remainder, not an item


def test_graphgpo_golden():
    # Graph (omega 0.5, r_succ 10): A -> B (t1, t3), B -> SUCCESS (t1 won), A -> C (t2), B -> C (t3); C is where
    # t2 and t3 end without a win: a dead end. BFS from SUCCESS on reversed edges: d(B) = 1, d(A) = 2; C cannot
    # reach SUCCESS: d_max = 2, so d(C) = d(dead end) = 3.
    # R_G = 10 * 0.5^d(next): t1: A->B 5, B->SUCCESS 10; t2: A->C 1.25, C->end 1.25; t3: A->B 5, B->C 1.25,
    # C->end 1.25.
    # A_G within the anchor group of s_t: A = {5 (t1), 1.25 (t2), 5 (t3)}: mean 3.75, deviations 1.25, -2.5, 1.25,
    #   var 4.6875, std 2.1650635 -> 0.5773503, -1.1547005, 0.5773503; B = {10 (t1), 1.25 (t3)} -> +-0.7071068;
    #   C = {1.25, 1.25} -> 0.
    inputs, kw = _golden()
    terms = graphgpo_advantage_terms(*inputs, **kw, omega=0.5)
    a_g = [0.0, _E, 0.0, _E, 0.7071068, -2 * _E, -0.7071068]
    np.testing.assert_allclose(terms.step_adv, a_g, atol=1e-5)
    np.testing.assert_allclose(terms.episode_adv, A_E_GOLDEN, atol=1e-5)
    np.testing.assert_allclose(terms.advantage, np.add(a_g, A_E_GOLDEN), atol=1e-5)  # beta_E = beta_G = 1
    np.testing.assert_array_equal(terms.extras["distance"], [3, 2, 3, 2, 1, 2, 1])
    np.testing.assert_array_equal(terms.extras["next_distance"], [3, 1, 3, 1, 0, 3, 3])
    np.testing.assert_allclose(terms.extras["graph_return"], [1.25, 5, 1.25, 5, 10, 1.25, 1.25])
    # The paper's omega^(d + 1) is omega times this on every row: with mean_std, A_G is the same.
    scaled = graphgpo_advantage_terms(*inputs, **kw, omega=0.5, success_reward=5.0)
    np.testing.assert_allclose(scaled.step_adv, terms.step_adv, atol=1e-5)
    # progress (the code's normalize_distance): 10 * 0.5^(d(next) - d(cur) + 1): A->B (2 -> 1) 10, B->S 10,
    # A->C (2 -> 3) 2.5, C->end (3 -> 3) 5, B->C (1 -> 3) 1.25
    progress = graphgpo_advantage_terms(*inputs, **kw, omega=0.5, progress=True)
    np.testing.assert_allclose(progress.extras["graph_return"], [5, 10, 5, 10, 10, 2.5, 1.25])
    # invalid_penalty: t2's first reply held no valid action: R_G 1.25 - 0.1
    penalised = graphgpo_advantage_terms(*inputs, **kw, omega=0.5, invalid_penalty=0.1)
    assert penalised.extras["graph_return"][5] == pytest.approx(1.15)


def test_graphgpo_group_without_win_gets_no_graph_term():
    inputs, kw = _golden(won=np.zeros(len(GOLDEN), dtype=bool))
    terms = graphgpo_advantage_terms(*inputs, **kw, invalid_penalty=0.5)  # the penalty alone would differ
    assert np.all(terms.step_adv == 0)
    # every state and every end is d_max + 1 = 1 when nothing reaches SUCCESS
    assert np.all(terms.extras["next_distance"] == 1) and terms.stats["graphgpo/frac_groups_with_win"] == 0.0


def test_g2po_golden():
    # gamma 0.5, r_succ 10, c 0.1. Visits gamma^(T - t) R_tau: t1 (won, T = 2): A 0.5^2 * 10 = 2.5, B 0.5 * 10 = 5;
    # t2, t3 lost: 0. Node values: V(A) = (2.5 + 0 + 0) / 3 = 0.8333333, V(B) = (5 + 0) / 2 = 2.5, V(C) = 0.
    # V'(t): t1: V(B) 2.5, then won 10; t2: V(C) 0, then lost 0; t3: V(B) 2.5, V(C) 0, then 0.
    # A_1 within the node of s_t, of V' - 0.1 * invalid (t2's step 0 invalid): A = {2.5, -0.1, 2.5} -> 0.5773503,
    #   -1.1547005, 0.5773503; B = {10 (t1), 0 (t3)} -> +-0.7071068; C = {0, 0} -> 0.
    # A_2 over the group of V' - V(s_t): t1 5/3, 7.5; t2 -5/6, 0; t3 5/3, -2.5, 0: mean 7.5 / 7 = 1.0714286,
    #   unbiased var 10.1190476, std 3.1810451 -> t1 0.1871203, 2.0208992; t2 -0.5987850, -0.3368165;
    #   t3 0.1871203, -1.1227218, -0.3368165.
    inputs, kw = _golden()
    terms = g2po_advantage_terms(*inputs, **kw)
    a_1 = [0.0, _E, 0.0, _E, 0.7071068, -2 * _E, -0.7071068]
    a_2 = [-0.3368165, 0.1871203, -0.3368165, 0.1871203, 2.0208992, -0.5987850, -1.1227218]
    np.testing.assert_allclose(terms.step_adv, np.add(a_1, a_2), atol=1e-5)
    np.testing.assert_allclose(terms.advantage, np.add(terms.step_adv, A_E_GOLDEN), atol=1e-5)
    np.testing.assert_allclose(terms.extras["node_value"], [0, 5 / 6, 0, 5 / 6, 2.5, 5 / 6, 2.5], atol=1e-9)
    np.testing.assert_allclose(terms.extras["next_value"], [0, 2.5, 0, 2.5, 10, 0, 0], atol=1e-9)


# ----------------------------------------------------------------------------------------------------------------
# reduces to


def test_reductions_to_gigpo():
    rng = np.random.default_rng(7)
    for _ in range(20):
        b = random_batch(rng)
        gigpo = gigpo_advantage_terms(*b.inputs, row_mask=b.row_mask, gamma=0.5)
        # HGPO with K = 0 is GiGPO's step term alone (one depth, weight 1, zero items dropped)
        hgpo = hgpo_advantage_terms(*b.inputs, row_mask=b.row_mask, gamma=0.5, history_length=0)
        np.testing.assert_allclose(hgpo.advantage, gigpo.step_adv, atol=1e-12)
        # GraphGPO and G2PO with their step weight 0 are the episode term alone
        for fn in (graphgpo_advantage_terms, g2po_advantage_terms):
            terms = fn(*b.inputs, **b.outcome, row_mask=b.row_mask, gamma=0.5, step_advantage_w=0.0)
            np.testing.assert_allclose(terms.advantage, gigpo.episode_adv, atol=1e-12)


# ----------------------------------------------------------------------------------------------------------------
# random batches vs the loop oracles


class Batch:
    """A random batch: ``inputs`` (the six per-row arguments), ``outcome`` (won, action_valid), ``row_mask``."""

    def __init__(self, inputs, outcome, row_mask):
        self.inputs, self.outcome, self.row_mask = inputs, outcome, row_mask

    def lists(self):
        rewards, _, groups, traj, step, anchor = self.inputs
        return [float(x) for x in rewards], list(groups), list(traj), list(step), list(anchor)


def random_batch(rng: np.random.Generator, rewards: tuple[float, ...] | None = None) -> Batch:
    """Episode groups of 1-6 trajectories of 1-7 steps over a few anchors (revisits and singletons), some groups
    without a win, rewards in {0, 1, -0.25} (exact sums at gamma 0.5; ``rewards``: drawn from these instead),
    step-id gaps, verl padding copies and failed episodes (row_mask False, their ids arbitrary), rows shuffled."""
    rows = []
    for g in range(int(rng.integers(1, 5))):
        anchors = [f"s{k}" for k in range(int(rng.integers(1, 6)))]
        p_win = [0.0, 0.3, 0.7][int(rng.integers(3))]
        for k in range(int(rng.integers(1, 7))):
            length, won = int(rng.integers(1, 8)), bool(rng.random() < p_win)
            failed = rng.random() < 0.1
            step_ids = np.cumsum(rng.integers(1, 3, size=length)) - 1 if rng.random() < 0.3 else np.arange(length)
            for t in range(length):
                if rewards is None:
                    reward = (1.0 if won and t == length - 1 else 0.0) - (0.25 if rng.random() < 0.2 else 0.0)
                else:
                    reward = rewards[int(rng.integers(len(rewards)))]
                valid_action = bool(rng.random() > 0.2)
                anchor = anchors[int(rng.integers(len(anchors)))] if not failed else None
                rows.append((reward, f"g{g}", f"g{g}-t{k}", int(step_ids[t]), anchor, won, valid_action, not failed))
    pads = [rows[int(i)][:7] + (False,) for i in rng.integers(len(rows), size=int(rng.integers(0, 4)))]
    rows += pads  # verl's padding rows: deep copies (same traj and step ids), masked
    rows = [rows[int(i)] for i in rng.permutation(len(rows))]
    reward, group, traj, step, anchor, won, valid, mask = (list(x) for x in zip(*rows, strict=True))
    n = len(rows)
    inputs = (
        torch.tensor(reward, dtype=torch.float64),
        torch.ones(n, 3),
        np.array(group, dtype=object),
        np.array(traj, dtype=object),
        np.array(step),
        np.array(anchor, dtype=object),
    )
    return Batch(inputs, {"won": np.array(won), "action_valid": np.array(valid)}, np.array(mask))


def _check(terms, expected, keys):
    for key in keys:
        got = terms.extras[key] if key in terms.extras else getattr(terms, key)
        np.testing.assert_allclose(got, expected[key], atol=ATOL, rtol=1e-9, err_msg=key)


HGPO_OPTIONS = [
    {},
    {"history_length": 0},
    {"history_length": 3, "alpha": 2.0},
    {"weight_base": "depth_plus_one", "std": "population"},
    {"episode_term": True, "norm": "mean", "episode_stats": "step"},
    {"alpha": 0.0, "episode_term": True},
]


@pytest.mark.parametrize("options", HGPO_OPTIONS)
def test_hgpo_matches_loop_oracle(options):
    rng = np.random.default_rng(len(str(options)))
    for _ in range(40):
        b = random_batch(rng)
        terms = hgpo_advantage_terms(*b.inputs, row_mask=b.row_mask, gamma=0.5, **options)
        expected = loop_hgpo_terms(*b.lists(), row_mask=list(b.row_mask), gamma=0.5, **options)
        _check(terms, expected, ("episode_adv", "step_adv", "advantage", "depths_used", "deepest_depth"))


@pytest.mark.parametrize("options", [{}, {"norm": "mean", "episode_term": True}, {"episode_term": True}])
def test_hgpo_matches_loop_oracle_with_rounding_ties(options):
    # Decimal rewards at gamma 1: returns that are equal in exact arithmetic (0.1 + 0.2 and 0.3) differ in floats,
    # and a row at its group's mean leaves a float remainder. Both implementations decide V by the exact rule, on
    # their own float means, so they agree on every depth; the batches must hold such ties (rounding_ties).
    rng = np.random.default_rng(11 + len(str(options)))
    ties = 0
    for _ in range(40):
        b = random_batch(rng, rewards=(0.0, 0.1, 0.2, 0.3, 0.7))
        terms = hgpo_advantage_terms(*b.inputs, row_mask=b.row_mask, gamma=1.0, history_length=2, **options)
        expected = loop_hgpo_terms(*b.lists(), row_mask=list(b.row_mask), gamma=1.0, history_length=2, **options)
        _check(terms, expected, ("episode_adv", "step_adv", "advantage", "depths_used", "deepest_depth"))
        ties += expected["rounding_ties"]
        perm = rng.permutation(len(b.row_mask))  # another summation order gives the same depths
        permuted = hgpo_advantage_terms(
            *(x[perm] for x in b.inputs), row_mask=b.row_mask[perm], gamma=1.0, history_length=2, **options
        )
        np.testing.assert_array_equal(permuted.extras["depths_used"], terms.extras["depths_used"][perm])
    assert ties > 0


GRAPHGPO_OPTIONS = [
    {},
    {"omega": 0.2, "norm": "mean"},
    {"progress": True, "invalid_penalty": 0.1},
    {"episode_advantage_w": 0.5, "step_advantage_w": 2.0, "episode_stats": "step", "success_reward": 1.0},
]


@pytest.mark.parametrize("options", GRAPHGPO_OPTIONS)
def test_graphgpo_matches_loop_oracle(options):
    rng = np.random.default_rng(100 + len(str(options)))
    for _ in range(40):
        b = random_batch(rng)
        terms = graphgpo_advantage_terms(*b.inputs, **b.outcome, row_mask=b.row_mask, gamma=0.5, **options)
        expected = loop_graphgpo_terms(
            *b.lists(),
            list(b.outcome["won"]),
            list(b.outcome["action_valid"]),
            row_mask=list(b.row_mask),
            gamma=0.5,
            **options,
        )
        keys = ("episode_adv", "step_adv", "advantage", "distance", "next_distance", "graph_return")
        _check(terms, expected, keys)


G2PO_OPTIONS = [{}, {"norm": "mean", "invalid_penalty": 0.0}, {"step_advantage_w": 0.5, "success_reward": 1.0}]


@pytest.mark.parametrize("options", G2PO_OPTIONS)
def test_g2po_matches_loop_oracle(options):
    rng = np.random.default_rng(200 + len(str(options)))
    for gamma in (0.5, 0.95):
        for _ in range(20):
            b = random_batch(rng)
            terms = g2po_advantage_terms(*b.inputs, **b.outcome, row_mask=b.row_mask, gamma=gamma, **options)
            expected = loop_g2po_terms(
                *b.lists(),
                list(b.outcome["won"]),
                list(b.outcome["action_valid"]),
                row_mask=list(b.row_mask),
                gamma=gamma,
                **options,
            )
            _check(terms, expected, ("episode_adv", "step_adv", "advantage", "node_value", "next_value"))


@pytest.mark.parametrize("method", ["hgpo", "graphgpo", "g2po"])
def test_permuting_the_batch_permutes_the_terms(method):
    rng = np.random.default_rng(3)
    fn = ESTIMATOR_TERMS[method]
    for _ in range(10):
        b = random_batch(rng)
        extra = {} if method == "hgpo" else b.outcome
        terms = fn(*b.inputs, **extra, row_mask=b.row_mask)
        perm = rng.permutation(len(b.row_mask))
        permuted = fn(*(x[perm] for x in b.inputs), **{k: v[perm] for k, v in extra.items()}, row_mask=b.row_mask[perm])
        np.testing.assert_allclose(permuted.advantage, terms.advantage[perm], atol=1e-12)
        for key, values in terms.extras.items():
            np.testing.assert_allclose(permuted.extras[key], values[perm], atol=1e-12)


@pytest.mark.parametrize(
    ("method", "own"), [("hgpo", HGPO_STAT_NAMES), ("graphgpo", GRAPHGPO_STAT_NAMES), ("g2po", G2PO_STAT_NAMES)]
)
def test_stats_and_method(method, own):
    b = random_batch(np.random.default_rng(11))
    terms = ESTIMATOR_TERMS[method](*b.inputs, **({} if method == "hgpo" else b.outcome), row_mask=b.row_mask)
    assert terms.method == method
    assert set(terms.stats) == {*STAT_NAMES, *own}
    assert all(np.isfinite(v) for v in terms.stats.values())
    assert terms.stats["gigpo/num_masked_rows"] == float((~b.row_mask).sum())
    assert np.all(terms.advantage[~b.row_mask] == 0)
    adv, ret = terms.token_level(torch.ones(len(b.row_mask), 3))
    torch.testing.assert_close(adv[:, 0], torch.tensor(terms.advantage, dtype=torch.float32))


# ----------------------------------------------------------------------------------------------------------------
# validation


def test_outcome_is_required_and_checked():
    inputs, kw = _golden()
    with pytest.raises(ValueError, match=r"graphgpo needs won"):
        graphgpo_advantage_terms(*inputs)
    with pytest.raises(ValueError, match=r"g2po with invalid_penalty > 0 needs action_valid"):
        g2po_advantage_terms(*inputs, won=kw["won"])
    g2po_advantage_terms(*inputs, won=kw["won"], invalid_penalty=0.0)  # nothing to penalise: not needed
    mixed = kw["won"].copy()
    mixed[0] = True  # row 0 is t3's last step; t3's other rows say lost
    with pytest.raises(ValueError, match=r"won differs .*'t3': True at row 0, False"):
        g2po_advantage_terms(*inputs, won=mixed, action_valid=kw["action_valid"])
    with pytest.raises(ValueError, match=r"won\[1\] = 2 is not a bool"):
        graphgpo_advantage_terms(*inputs, won=np.array([0, 2, 0, 0, 1, 0, 0]))
    with pytest.raises(ValueError, match=r"won has 3 .*step_rewards has 7"):
        graphgpo_advantage_terms(*inputs, won=[True, False, True])
    # a masked row may say anything: it takes part in nothing
    terms = graphgpo_advantage_terms(*inputs, won=mixed, row_mask=np.arange(7) != 0)
    assert terms.advantage[0] == 0


@pytest.mark.parametrize(
    ("fn", "options", "match"),
    [
        (hgpo_advantage_terms, {"history_length": -1}, r"history_length=-1 .*>= 0"),
        (hgpo_advantage_terms, {"history_length": 1.5}, r"history_length=1\.5 .*whole number"),
        (hgpo_advantage_terms, {"alpha": -1.0}, r"alpha=-1\.0 .*>= 0"),
        (hgpo_advantage_terms, {"weight_base": "k"}, r"weight_base='k'.*'depth'.*'depth_plus_one'"),
        (hgpo_advantage_terms, {"std": "biased"}, r"std='biased'.*'unbiased'"),
        (hgpo_advantage_terms, {"episode_term": 1}, r"episode_term=1 .*true or false"),
        (hgpo_advantage_terms, {"norm": "mean_norm"}, r"norm='mean_norm' is not a norm"),
        (graphgpo_advantage_terms, {"omega": 0.0}, r"omega=0\.0 .*\(0, 1\]"),
        (graphgpo_advantage_terms, {"omega": 1.5}, r"omega=1\.5 .*\(0, 1\]"),
        (graphgpo_advantage_terms, {"success_reward": 0}, r"success_reward=0 .*> 0"),
        (graphgpo_advantage_terms, {"step_advantage_w": float("inf")}, r"step_advantage_w=inf must be a finite"),
        (graphgpo_advantage_terms, {"progress": "yes"}, r"progress='yes' .*true or false"),
        (g2po_advantage_terms, {"invalid_penalty": -0.1}, r"invalid_penalty=-0\.1 .*>= 0"),
        (g2po_advantage_terms, {"gamma": 2.0}, r"gamma=2\.0 .*\[0, 1\]"),
    ],
)
def test_bad_options_raise(fn, options, match):
    inputs, kw = _golden()
    extra = {} if fn is hgpo_advantage_terms else {"won": kw["won"], "action_valid": kw["action_valid"]}
    with pytest.raises(ValueError, match=match):
        fn(*inputs, **extra, **options)
