"""CPU tests of the episode metrics both engines log (verl_gigpo.rollout.metrics): the same episodes, once as verl's
step rows (the agent loop's conversion, read back by the trainer mode) and once as the local engine's Episode
objects, give the same ``env/*`` and ``episode/*`` numbers, failed environments included; definitions by hand."""

from __future__ import annotations

import dataclasses

import pytest
from step_records import make_step as _step

from verl_gigpo.rollout import Episode, TaskSpec
from verl_gigpo.rollout.metrics import (
    TrajectorySummary,
    episode_metrics,
    summaries_from_episodes,
    type_metrics,
    validation_type,
)
from verl_gigpo.rollout.step_rows import StepBatch
from verl_gigpo.verl_glue.agent_loop import episode_to_outputs
from verl_gigpo.verl_glue.trainer import episode_metrics as trainer_episode_metrics


def _episode(traj_id, seed, steps, *, won=False, error=None, task_type="pick", env_s=0.0, gen_s=0.0) -> Episode:
    return Episode(
        traj_id=traj_id,
        task=TaskSpec("gridnav", seed=seed),
        task_type=task_type,
        steps=steps,
        won=won,
        episode_return=sum(s.step_reward for s in steps),
        env_error=error,
        timing={"env": env_s, "generate": gen_s},
    )


def _episodes() -> list[Episode]:
    """Task 0: a (won, 2 steps, one invalid), b (lost, 3 steps, one with history dropped, two with a cut
    observation), c (environment failed after a won-looking step with a cut observation), d (failed at reset).
    Task 1 (heat): e (won, 1 step), f (failed at reset)."""
    return [
        _episode("a", 0, [_step(0, valid=False), _step(1, reward=10.0)], won=True, env_s=1.0, gen_s=2.0),
        _episode("b", 0, [_step(0, cut=True), _step(1, dropped=1, cut=True), _step(2)], env_s=3.0, gen_s=4.0),
        _episode("c", 0, [_step(0, reward=5.0, cut=True)], won=True, error="EnvError: boom", env_s=5.0),
        _episode("d", 0, [], error="EnvError: reset failed"),
        _episode("e", 1, [_step(0, reward=1.0)], won=True, task_type="heat", gen_s=6.0),
        _episode("f", 1, [], error="EnvError: reset failed", task_type="heat"),
    ]


def _verl_rows(episodes: list[Episode]) -> StepBatch:
    """The rows the trainer mode reads: the agent loop's extra_fields, uid = task, plus one verl padding row (a copy
    of a failed episode's row, tagged is_padding)."""
    uids, extra = [], []
    for episode in episodes:
        for row in episode_to_outputs(episode, placeholder_prompt_ids=[5], eos_id=2, weight_version=0):
            uids.append(f"task{episode.task.seed}")
            extra.append(row.extra_fields)
    uids.append("task0")
    extra.append(dict(extra[5]))  # c's row
    return StepBatch.from_rows(uids, extra, [False] * (len(uids) - 1) + [True])


def test_both_engines_give_the_same_metrics_with_failed_environments():
    episodes = _episodes()
    verl = trainer_episode_metrics(_verl_rows(episodes))
    local = episode_metrics(summaries_from_episodes(episodes))
    assert set(verl) == set(local)
    # by hand, over a, b, e (c, d and f failed): won 2 of 3, lengths 2, 3, 1
    assert verl["env/success_rate"] == local["env/success_rate"] == pytest.approx(2 / 3)
    assert verl["env/episode_length"] == local["env/episode_length"] == pytest.approx(2.0)
    assert verl["env/env_error_rate"] == local["env/env_error_rate"] == pytest.approx(3 / 6)
    assert local["env/invalid_action_rate"] == pytest.approx(1 / 6) == local["env/history_dropped_rate"]
    assert verl["env/observation_truncated_rate"] == local["env/observation_truncated_rate"] == pytest.approx(2 / 6)
    assert local["env/success_rate/pick"] == pytest.approx(1 / 2) and local["env/success_rate/heat"] == 1.0
    assert local["episode/return_mean"] == pytest.approx((9.9 + 0.0 + 1.0) / 3)
    assert local["episode/num_trajectories"] == 6.0
    assert local["episode/env_seconds_mean"] == pytest.approx(9 / 6)
    assert local["episode/generate_seconds_mean"] == pytest.approx(12 / 6)
    # both engines keep the failed episodes' rows in the training batch, masked: c's step, a placeholder row each
    # for d and f (the local engine's batch, StepBatch.from_episodes, counts the same rows)
    assert verl["episode/num_step_rows"] == local["episode/num_step_rows"] == 2 + 3 + 1 + 1 + 1 + 1
    assert episode_metrics(StepBatch.from_episodes(episodes).trajectory_summaries()) == local
    for name in verl:
        assert verl[name] == pytest.approx(local[name], abs=1e-12), name


def test_summaries_from_rows_equal_summaries_from_episodes():
    episodes = _episodes()
    from_rows = _verl_rows(episodes).trajectory_summaries()
    from_episodes = summaries_from_episodes(episodes)
    assert len(from_rows) == len(from_episodes) == 6  # the padding copy is no trajectory
    for row, episode in zip(from_rows, from_episodes, strict=True):
        assert dataclasses.replace(row, batch_rows=0, episode_return=0.0) == dataclasses.replace(
            episode, batch_rows=0, episode_return=0.0
        )
        assert row.episode_return == pytest.approx(episode.episode_return)
    assert [t.length for t in from_rows] == [2, 3, 1, 0, 1, 0]  # d and f failed at reset: 0 steps, 1 placeholder row
    assert [t.batch_rows for t in from_rows] == [2, 3, 1, 1, 1, 1]
    assert [t.batch_rows for t in from_episodes] == [2, 3, 1, 1, 1, 1]


def test_prefixes_name_the_validation_metrics():
    summaries = summaries_from_episodes(_episodes())
    train = episode_metrics(summaries)
    val = episode_metrics(summaries, prefix="val", episode_prefix="val")
    rename = {k: k.replace("env/", "val/", 1).replace("episode/", "val/", 1) for k in train}
    assert set(val) == set(rename.values())
    assert all(val[rename[k]] == train[k] for k in train)
    assert {"val/success_rate", "val/episode_length", "val/return_mean"} <= set(val)  # the local engine's names


def test_empty_batch_and_means_over_no_trajectory():
    assert episode_metrics([]) == {}
    failed = [TrajectorySummary(won=True, length=3, episode_return=1.0, env_error=True, batch_rows=3)]
    m = episode_metrics(failed)
    assert m["env/env_error_rate"] == 1.0 and m["episode/num_trajectories"] == 1.0
    assert m["env/success_rate"] == m["env/episode_length"] == m["env/invalid_action_rate"] == 0.0
    assert m["episode/return_std"] == 0.0 and not any(k.startswith("env/success_rate/") for k in m)


def test_validation_per_task_type_is_the_same_on_both_engines():
    """The same validation episodes through verl's own ``_val_metrics_update`` (wrapped by the trainer mode, fed the
    final rows' ``reward_extra_info`` as verl's ``_validate`` collects them) and through the local engine's
    function give the same ``val-core/<env>/<type>/*`` keys; verl's own keys are still there."""
    from verl_gigpo.verl_glue.trainer import GiGPOTrainerSync

    episodes = _episodes()
    infos: dict[str, list] = {"reward": []}
    for episode in episodes:
        last = episode_to_outputs(episode, placeholder_prompt_ids=[5], eos_id=2, weight_version=0)[-1]
        infos["reward"].append(last.reward_score)
        for key, value in last.extra_fields["reward_extra_info"].items():
            infos.setdefault(key, []).append(value)
    uids = [f"u{i}" for i in range(len(episodes))]
    trainer = GiGPOTrainerSync.__new__(GiGPOTrainerSync)  # the method reads no attribute of the trainer
    verl = trainer._val_metrics_update(["gridnav"] * len(episodes), uids, infos, [2] * len(episodes))
    local = type_metrics("gridnav", summaries_from_episodes(episodes))
    # by hand over a, b (pick) and e (heat); c, d, f failed
    assert local == {
        "val-core/gridnav/heat/success": 1.0,
        "val-core/gridnav/heat/length": 1.0,
        "val-core/gridnav/heat/invalid_per_step": 0.0,
        "val-core/gridnav/heat/count": 1.0,
        "val-core/gridnav/pick/success": 0.5,
        "val-core/gridnav/pick/length": 2.5,
        "val-core/gridnav/pick/invalid_per_step": pytest.approx(1 / 5),
        "val-core/gridnav/pick/count": 2.0,
    }
    assert {k: v for k, v in verl.items() if k in local} == local
    assert "val-core/gridnav/acc/mean@1" in verl and not any("task_type" in k or "env_error" in k for k in verl)


def test_validation_types_are_capped_and_named_by_their_first_part():
    assert validation_type("1hop/capital_of") == "1hop" and validation_type("nq") == "nq"
    assert validation_type(None) == validation_type("") == "all" and validation_type("a b") == "a_b"
    # 5 types, cap 3: the two most frequent keep their name, the rest are pooled under "other"
    kinds = ["x"] * 3 + ["y"] * 2 + ["z", "w", "v"]
    summaries = [TrajectorySummary(won=k == "z", length=1, episode_return=0.0, task_type=k) for k in kinds]
    m = type_metrics("env", summaries, max_types=3)
    assert {k.split("/")[2] for k in m} == {"x", "y", "other"}
    assert m["val-core/env/other/count"] == 3.0 and m["val-core/env/other/success"] == pytest.approx(1 / 3)
    assert len({k.split("/")[2] for k in type_metrics("env", summaries, max_types=5)}) == 5
    with pytest.raises(ValueError, match="max_types=1"):
        type_metrics("env", summaries, max_types=1)
