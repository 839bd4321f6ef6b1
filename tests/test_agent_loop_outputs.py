"""CPU tests of the agent loop's episode -> verl rows conversion, including failed episodes."""

from __future__ import annotations

from step_records import make_step

from verl_gigpo.rollout import Episode, TaskSpec
from verl_gigpo.rollout.step_rows import StepBatch
from verl_gigpo.verl_glue.agent_loop import episode_to_outputs


def test_one_row_per_step_with_the_final_reward_score():
    steps = [make_step(0, valid=False, versions=(3, 3)), make_step(1, reward=1.0, versions=(3, 4))]
    ep = Episode(traj_id="u_0", task=TaskSpec("gridnav", seed=5), task_id="train/5", steps=steps, won=True)
    ep.episode_return = sum(s.step_reward for s in steps)
    rows = episode_to_outputs(ep, placeholder_prompt_ids=[], eos_id=0)
    assert len(rows) == 2
    assert rows[0].reward_score is None and rows[1].reward_score == 0.9  # verl copies it to earlier rows
    assert rows[0].response_mask == [1, 1] and rows[0].response_logprobs == [-0.5, -0.25]
    first = rows[0].extra_fields
    assert (first["traj_id"], first["step_id"], first["anchor_key"]) == ("u_0", 0, "key0")
    assert first["step_reward"] == -0.1 and not first["action_valid"] and first["won"]  # won: the episode's
    assert (first["min_global_steps"], first["max_global_steps"]) == (3, 4)
    assert first["reward_extra_info"] == {
        "acc": 1.0,
        "episode_length": 2.0,
        "invalid_actions": 1.0,
        "task_type": "",  # the episode has none; the trainer mode's per-type validation reads it as "all"
        "env_error": 0.0,
    }


def test_an_episode_failed_at_reset_gives_one_masked_placeholder_row():
    ep = Episode(traj_id="u_1", task=TaskSpec("alfworld", seed=0), env_error="EnvError: no games")
    (row,) = episode_to_outputs(ep, placeholder_prompt_ids=[5, 6], eos_id=2, weight_version=7)
    assert row.prompt_ids == [5, 6] and row.response_ids == [2] and row.response_mask == [0]
    assert row.extra_fields["env_error"] and row.extra_fields["env_error_message"] == "EnvError: no games"
    assert (row.extra_fields["min_global_steps"], row.extra_fields["max_global_steps"]) == (7, 7)
    # every field a real row carries (TransferQueue drops a field for the whole batch if one row lacks it, and verl's
    # old-log-prob step then raised KeyError('rollout_log_probs'); tests/test_e2e_verl_cpu.py runs that path)
    real = episode_to_outputs(
        Episode(traj_id="u_0", task=TaskSpec("gridnav", seed=0), steps=[make_step(0, versions=(3, 3))]),
        placeholder_prompt_ids=[],
        eos_id=2,
    )[0]
    assert row.response_logprobs == [0.0]
    assert {k for k, v in vars(real).items() if v is not None} <= {k for k, v in vars(row).items() if v is not None}
    assert set(real.extra_fields) == set(row.extra_fields)
    steps = StepBatch.from_rows(["u"], [row.extra_fields], [False])
    assert not steps.row_mask[0]  # the trainer mode leaves it out of every statistic


def test_rows_of_an_episode_that_failed_mid_way_carry_no_loss():
    ep = Episode(
        traj_id="u_2",
        task=TaskSpec("gridnav", seed=1),
        steps=[make_step(0, versions=(3, 3))],
        env_error="EnvError: boom",
    )
    (row,) = episode_to_outputs(ep, placeholder_prompt_ids=[], eos_id=0)
    assert row.response_mask == [0, 0] and row.extra_fields["env_error"]


def test_each_worker_wide_object_has_its_own_lock(tmp_path):
    """Making the environment pool starts processes under its lock: the thread pool and the writers, each under its
    own lock, are handed out meanwhile (one lock for all four held every agent loop of the worker back)."""
    import threading

    from verl_gigpo.verl_glue.agent_loop import GiGPOEnvAgentLoop as Loop

    locks = [Loop._executor_lock, Loop._env_pool_lock, Loop._transcripts_lock, Loop._episode_parts_lock]
    assert len({id(lock) for lock in locks}) == 4
    got = {}

    def others():
        got["writer"] = Loop.transcript_writer(str(tmp_path / "transcripts"))
        got["parts"] = Loop.part_writer(str(tmp_path / "run"))
        got["executor"] = Loop.executor()

    with Loop._env_pool_lock:  # as while the first agent loop builds the environment pool
        thread = threading.Thread(target=others, daemon=True)
        thread.start()
        thread.join(timeout=30)
        assert not thread.is_alive(), "a worker-wide object waited on the environment pool's lock"
    assert got["writer"] is Loop.transcript_writer(str(tmp_path / "transcripts"))  # made once per key
    assert got["parts"].folder == tmp_path / "run" / "episodes_parts" and got["executor"] is Loop.executor()
