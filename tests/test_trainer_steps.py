"""CPU unit tests of the trainer mode's step-row handling (no Ray): reading rows, metrics, similarity keys."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verl_gigpo.advantage.anchors import anchor_group_ids
from verl_gigpo.config import GiGPOConfig
from verl_gigpo.rollout.step_rows import StepBatch
from verl_gigpo.verl_glue.trainer import episode_metrics


def _row(traj, step, key, reward, *, valid=True, won=False, error=False, task_type="pick", dropped=0):
    return {
        "traj_id": traj,
        "step_id": step,
        "anchor_key": key,
        "step_reward": reward,
        "action_valid": valid,
        "won": won,
        "env_error": error,
        "task_type": task_type,
        "history_dropped": dropped,
    }


def _batch():
    """Two groups; g0 has trajectories a (won, 2 steps) and b (lost, 3 steps); g1 has c (env error) and d."""
    rows = [
        ("g0", _row("a", 0, "s0", 0.0, won=True)),
        ("g0", _row("a", 1, "s1", 10.0, won=True)),
        ("g0", _row("b", 0, "s0", -0.1, valid=False)),
        ("g0", _row("b", 1, "s0", 0.0, dropped=1)),
        ("g0", _row("b", 2, "s2", 0.0)),
        ("g1", _row("c", 0, "x", 0.0, error=True, task_type="heat")),
        ("g1", _row("d", 0, "x", 0.0, task_type="heat")),
    ]
    uids = [g for g, _ in rows] + ["pad123"]  # verl's padding row: a deep copy of the first row, uid "pad..."
    extra = [r for _, r in rows] + [dict(rows[0][1])]
    return StepBatch.from_rows(uids, extra, [False] * len(rows) + [True])


def test_padding_and_failed_episodes_are_masked():
    steps = _batch()
    assert steps.row_mask.tolist() == [True, True, True, True, True, False, True, False]


def test_episode_metrics_by_hand():
    m = episode_metrics(_batch())
    # trajectories a (won, 2 steps), b (3 steps), c (env error, 1 row), d (1 step); padding excluded. The failed c
    # counts in the error rate, the trajectory and row counts only; the policy metrics are over a, b, d.
    assert m["episode/num_trajectories"] == 4 and m["episode/num_step_rows"] == 7
    assert m["env/env_error_rate"] == pytest.approx(1 / 4)
    assert m["env/success_rate"] == pytest.approx(1 / 3)
    assert m["env/success_rate/pick"] == pytest.approx(1 / 2) and m["env/success_rate/heat"] == 0.0
    assert m["env/invalid_action_rate"] == pytest.approx(1 / 6)
    assert m["env/episode_length"] == pytest.approx((2 + 3 + 1) / 3)
    assert m["env/history_dropped_rate"] == pytest.approx(1 / 6)
    assert m["episode/return_max"] == pytest.approx(10.0) and m["episode/return_min"] == pytest.approx(-0.1)
    assert m["episode/return_mean"] == pytest.approx((10.0 - 0.1 + 0.0) / 3)


def test_episode_metrics_of_padding_only_and_all_failed_batches():
    padding_only = StepBatch.from_rows(["pad0"], [_row("a", 0, "s0", 1.0)], [True])
    assert episode_metrics(padding_only) == {}
    rows = [_row("x", 0, "k", 1.0, won=True, error=True), _row("y", 0, "k", 0.0, error=True)]
    m = episode_metrics(StepBatch.from_rows(["g", "g"], rows, [False, False]))
    assert m["env/env_error_rate"] == 1.0 and m["episode/num_trajectories"] == 2.0 and m["episode/num_step_rows"] == 2.0
    # nothing to average over: 0.0 (the keys stay), even though x reported won before its environment failed
    assert m["env/success_rate"] == m["env/episode_length"] == m["episode/return_mean"] == 0.0


def test_padding_copy_of_a_failed_row_is_not_a_trajectory():
    # verl tags padding rows is_padding; a copy of a failed episode's row (env_error True) must not count.
    rows = [_row("a", 0, "s", 1.0, won=True), _row("c", 0, "s", 0.0, error=True)]
    steps = StepBatch.from_rows(["g", "g", "g"], [*rows, dict(rows[1])], [False, False, True])
    m = episode_metrics(steps)
    assert m["episode/num_trajectories"] == 2.0 and m["episode/num_step_rows"] == 2.0
    assert m["env/env_error_rate"] == 0.5 and m["env/success_rate"] == 1.0


def test_rows_without_step_fields_name_the_agent_loop():
    with pytest.raises(ValueError, match="gigpo_env_agent"):
        StepBatch.from_rows(["u"], [{"turn_scores": []}], [False])
    with pytest.raises(ValueError, match="differ in length"):
        StepBatch.from_rows(["u", "v"], [{}], [False])


def test_similarity_key_mode_merges_near_identical_observations():
    obs = "You are in the middle of a room. Looking quickly around you, you see a cabinet 1, a countertop 1."
    rows = [_row("a", 0, obs, 1.0), _row("b", 0, obs + " ", 0.0), _row("c", 0, obs.replace("1.", "2."), 0.5)]
    steps = StepBatch.from_rows(["g"] * 3, rows, [False] * 3)
    mask = torch.ones(3, 2)
    exact = steps.advantage_terms(GiGPOConfig(key_mode="observation"), mask).stats
    similar = steps.advantage_terms(GiGPOConfig(key_mode="similarity", similarity_threshold=0.9), mask).stats
    assert exact["gigpo/num_step_groups"] == 3 and similar["gigpo/num_step_groups"] < 3
    ids = anchor_group_ids(steps.anchor_keys, steps.group_ids, similarity_threshold=0.9)
    assert ids[0] == ids[1]


def test_config_from_verl_algorithm_section():
    algorithm = OmegaConf.create({"gamma": 0.9, "gigpo": {"norm": "mean", "step_advantage_w": 0.5}})
    cfg = GiGPOConfig.from_algorithm(algorithm)
    assert (cfg.gamma, cfg.norm, cfg.step_advantage_w) == (0.9, "mean", 0.5)
    with pytest.raises(ValueError, match="mean_norm"):
        GiGPOConfig.from_algorithm(OmegaConf.create({"gamma": 0.9, "gigpo": {"norm": "mean_norm"}}))
    assert np.isclose(GiGPOConfig.from_algorithm(OmegaConf.create({"gamma": 1.0})).gamma, 1.0)
    assert GiGPOConfig.from_algorithm(None) == GiGPOConfig() == GiGPOConfig.from_algorithm({"gigpo": None})


@pytest.mark.parametrize("method", ["gigpo", "hgpo", "graphgpo", "g2po"])
def test_the_estimator_gets_the_rows_fields_and_masks_padding_and_failed_episodes(method):
    """The trainer mode's advantage step (:meth:`StepBatch.advantage_terms` on the rows read from ``extra_fields``)
    is the method's estimator on the rows' rewards, ids, keys, outcome and validity (GraphGPO and G2PO read won and
    action_valid), with the failed episode's row and verl's padding row masked: they get 0 on every token."""
    from verl_gigpo.advantage import ESTIMATOR_TERMS

    steps = _batch()
    mask = torch.ones(len(steps.group_ids), 2)
    cfg = GiGPOConfig(method=method)
    terms = steps.advantage_terms(cfg, mask)
    outcome = method in ("graphgpo", "g2po")
    extra = {"won": steps.won, "action_valid": steps.action_valid} if outcome else {}
    want = ESTIMATOR_TERMS[method](
        torch.as_tensor(steps.step_rewards, dtype=torch.float64),  # float64, as StepBatch passes them
        mask,
        steps.group_ids,
        steps.traj_ids,
        steps.step_ids,
        steps.anchor_keys,
        row_mask=steps.row_mask,
        gamma=cfg.gamma,
        **extra,
    )
    np.testing.assert_array_equal(terms.advantage, want.advantage)
    np.testing.assert_array_equal(terms.step_return, want.step_return)
    assert terms.method == method and terms.stats == want.stats
    advantages, _ = terms.token_level(mask)  # (N, 2)
    assert advantages[[5, 7]].abs().sum() == 0 and advantages.abs().sum() > 0  # failed episode and padding rows
