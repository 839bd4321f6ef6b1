"""Per-step credit records (verl_gigpo/credit/records.py), CPU-only: the records are the estimator's terms for the same
batch (verl's step rows and a real local-engine run), a run with records off writes nothing and trains exactly as
one with them on, the options fail clearly, and the agent loop adds texts only when records are on."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from verl_gigpo.advantage import gigpo_advantage_terms
from verl_gigpo.config import GiGPOConfig
from verl_gigpo.credit.records import (
    RECORD_FIELDS,
    CreditLogger,
    CreditLogOptions,
    anchor_key_hash,
    read_credit_records,
)
from verl_gigpo.rollout import Episode, StepRecord, TaskSpec
from verl_gigpo.rollout.step_rows import StepBatch
from verl_gigpo.verl_glue.agent_loop import episode_to_outputs
from verl_gigpo.verl_glue.preflight import config_problems

# the per-row arrays of GiGPOTerms and the record field holding each
TERM_FIELDS = {
    "step_return": "step_return",
    "episode_return": "episode_return",
    "episode_adv": "episode_adv",
    "step_adv": "step_adv",
    "advantage": "advantage",
    "anchor_group": "anchor_group",
    "anchor_group_size": "anchor_group_size",
}


# ------------------------------------------------------------------------------------------- the estimator's terms
def test_anchor_group_is_the_pair_episode_group_and_key():
    groups = np.array(["g0", "g0", "g0", "g1", "g1", "g0"], dtype=object)
    keys = np.array(["s", "s", "t", "s", "s", "s"], dtype=object)
    terms = gigpo_advantage_terms(
        torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0, 5.0]),
        torch.ones(6, 1),
        groups,
        np.array(["a", "b", "c", "d", "e", "f"], dtype=object),
        np.zeros(6, dtype=np.int64),
        keys,
        row_mask=np.array([True, True, True, True, True, False]),
    )
    # numbered by first appearance among valid rows: (g0, s) = 0, (g0, t) = 1, (g1, s) = 2; the masked row -1
    assert terms.anchor_group.tolist() == [0, 0, 1, 2, 2, -1]
    assert terms.anchor_group_size.tolist() == [2, 2, 1, 2, 2, 0]


def _row(traj, step, key, reward, *, valid=True, won=False, error=False, obs="", action="up"):
    return {
        "traj_id": traj,
        "step_id": step,
        "anchor_key": key,
        "step_reward": reward,
        "action_valid": valid,
        "won": won,
        "env_error": error,
        "task_id": "task-7",
        "task_type": "pick",
        "history_dropped": 0,
        "observation": obs or f"obs of {key}",
        "action": action,
    }


def test_records_equal_the_estimator_terms_of_verl_step_rows(tmp_path):
    """The trainer mode's path without Ray: StepBatch from extra_fields -> StepBatch.advantage_terms -> CreditLogger."""
    rows = [
        ("g0", _row("a", 0, "s0", 0.0, won=True, action="right")),
        ("g0", _row("a", 1, "s1", 1.0, won=True, action="down")),
        ("g0", _row("b", 0, "s0", -0.1, valid=False, action="I think up")),
        ("g0", _row("b", 1, "s0", 0.0, action="right")),
        ("g0", _row("b", 2, "s1", 0.0, action="up")),
        ("g1", _row("c", 0, "x", 0.0, error=True)),
        ("g1", _row("d", 0, "x", 1.0, won=True)),
        ("g1", _row("e", 0, "x", 0.0)),
    ]
    uids = [g for g, _ in rows] + ["pad0"]  # verl's padding row: a copy of the first row
    extra = [r for _, r in rows] + [dict(rows[0][1])]
    steps = StepBatch.from_rows(uids, extra, [False] * len(rows) + [True])
    terms = steps.advantage_terms(GiGPOConfig(), torch.ones(len(uids), 2))
    logger = CreditLogger(CreditLogOptions(freq=5, groups=-1), tmp_path)
    path = logger.write(10, terms, steps)
    assert path == tmp_path / "credit" / "iter_10.jsonl"
    records = read_credit_records(path)
    kept = np.flatnonzero(terms.row_mask)
    assert kept.tolist() == [0, 1, 2, 3, 4, 6, 7]  # the env-error row and the padding row are not written
    assert len(records) == len(kept)
    for rec, i in zip(records, kept, strict=True):
        assert list(rec) == [*RECORD_FIELDS, "method"]  # GiGPO's terms carry no extras
        assert rec["method"] == "gigpo"
        for attr, key in TERM_FIELDS.items():
            assert rec[key] == getattr(terms, attr)[i], (key, i)
        assert rec["iteration"] == 10
        assert (rec["group"], rec["traj"], rec["step"]) == (uids[i], extra[i]["traj_id"], extra[i]["step_id"])
        assert rec["anchor_key"] == anchor_key_hash(extra[i]["anchor_key"])
        assert rec["step_reward"] == extra[i]["step_reward"]
        assert (rec["observation"], rec["action"]) == (extra[i]["observation"], extra[i]["action"])
        assert (rec["action_valid"], rec["won"]) == (extra[i]["action_valid"], extra[i]["won"])
        assert (rec["task_id"], rec["task_type"]) == ("task-7", "pick")
    # a trajectory's rows share R(tau) and A_E; rows of one anchor group share its id
    assert records[0]["step_adv"] > 0 > records[2]["step_adv"]  # from s0: 'right' of the winner beats b's reply


def test_groups_are_sampled_without_touching_other_generators(tmp_path):
    n = 40
    groups = np.repeat(np.arange(10), 4)  # 10 episode groups of 4 one-step trajectories
    terms = gigpo_advantage_terms(
        torch.arange(n, dtype=torch.float64) % 3, torch.ones(n, 1), groups, np.arange(n), np.zeros(n, int), groups
    )
    steps = _batch(groups, np.arange(n), np.zeros(n, int))
    state = np.random.get_state()
    torch_state = torch.get_rng_state()
    picks = []
    for run in ("a", "b"):
        path = CreditLogger(CreditLogOptions(freq=1, groups=3), tmp_path / run, seed=5).write(7, terms, steps)
        records = read_credit_records(path)
        assert len(records) == 12  # every row of the 3 sampled groups
        picks.append(sorted({r["group"] for r in records}))
    assert len(picks[0]) == 3 and picks[0] == picks[1]  # the same (seed, iteration) picks the same groups
    assert np.array_equal(np.random.get_state()[1], state[1]) and torch.equal(torch.get_rng_state(), torch_state)


def _batch(groups, trajs, step_ids):
    """A StepBatch of valid rows with the given ids (anchor key = the group), texts "o" and "a"."""
    n = len(groups)
    return StepBatch(
        group_ids=np.asarray(groups, dtype=object),
        traj_ids=np.asarray(trajs, dtype=object),
        step_ids=np.asarray(step_ids, dtype=np.int64),
        anchor_keys=np.asarray(groups, dtype=object),
        step_rewards=np.zeros(n),
        action_valid=np.ones(n, dtype=bool),
        won=np.zeros(n, dtype=bool),
        env_error=np.zeros(n, dtype=bool),
        task_types=np.full(n, None, dtype=object),
        history_dropped=np.zeros(n, dtype=np.int64),
        row_mask=np.ones(n, dtype=bool),
        observations=np.full(n, "o", dtype=object),
        actions=np.full(n, "a", dtype=object),
    )


def test_a_batch_of_other_rows_is_refused(tmp_path):
    terms = gigpo_advantage_terms(torch.zeros(2), torch.ones(2, 1), ["g", "g"], ["a", "b"], [0, 0], ["s", "s"])
    with pytest.raises(ValueError, match=r"batch has 3 rows .* have 2"):
        CreditLogger(CreditLogOptions(freq=1), tmp_path).write(1, terms, _batch(["g"] * 3, ["a", "b", "c"], [0] * 3))
    assert not (tmp_path / "credit").exists()


# ------------------------------------------------------------------------------------------- options
@pytest.mark.parametrize(
    ("trainer", "message"),
    [
        ({"credit_log_freq": -1}, r"trainer\.credit_log_freq=-1 .*>= 0"),
        ({"credit_log_freq": 1.5}, r"trainer.credit_log_freq=1.5"),
        ({"credit_log_freq": True}, r"trainer.credit_log_freq=True"),
        ({"credit_log_groups": 0}, r"trainer\.credit_log_groups=0 .* or -1"),
        ({"credit_log_max_chars": 0}, r"trainer\.credit_log_max_chars=0 .*>= 1"),
    ],
)
def test_bad_options_name_the_key(trainer, message):
    with pytest.raises(ValueError, match=message):
        CreditLogOptions.from_trainer(trainer)
    problems = config_problems({"trainer": trainer})  # the verl driver's preflight reports the same message
    assert any(re.match(message, p) for p in problems), problems


def test_defaults_and_due_iterations():
    off = CreditLogOptions.from_trainer({})
    assert (off.freq, off.groups, off.max_chars, off.enabled) == (0, 2, 200, False)
    assert not any(off.due(k) for k in range(1, 100))
    every_25 = CreditLogOptions.from_trainer({"credit_log_freq": 25})
    assert [k for k in range(0, 101) if every_25.due(k)] == [25, 50, 75, 100]  # never 0, before training


# ------------------------------------------------------------------------------------------- agent loop texts
def _episode():
    task = TaskSpec("gridnav", 3)
    steps = [
        StepRecord(
            0,
            "walls: none. goal: down 2." * 20,
            "k0",
            "p",
            [1],
            [2],
            None,
            "down",
            "down",
            True,
            0.0,
            0.0,
            False,
            False,
            False,
        ),
        StepRecord(
            1,
            "walls: none. goal: down 1.",
            "k1",
            "p",
            [1],
            [3],
            None,
            "jump!",
            None,
            False,
            0.0,
            -0.1,
            False,
            True,
            False,
        ),
    ]
    return Episode("t0", task, task_id="t-3", task_type="goal", steps=steps, episode_return=-0.1)


def test_agent_loop_adds_cut_texts_only_when_records_are_on():
    off = episode_to_outputs(_episode(), placeholder_prompt_ids=[], eos_id=0)
    assert all("observation" not in r.extra_fields and "action" not in r.extra_fields for r in off)
    on = episode_to_outputs(_episode(), placeholder_prompt_ids=[], eos_id=0, text_chars=30)
    assert on[0].extra_fields["observation"] == ("walls: none. goal: down 2." * 2)[:29] + "…"
    assert on[0].extra_fields["action"] == "down"
    assert on[1].extra_fields["observation"] == "walls: none. goal: down 1."
    assert on[1].extra_fields["action"] == "jump!"  # no valid action: the reply itself
    failed = Episode("t1", TaskSpec("gridnav", 3), env_error="boom")
    (placeholder,) = episode_to_outputs(failed, placeholder_prompt_ids=[1], eos_id=0, text_chars=30)
    assert (placeholder.extra_fields["observation"], placeholder.extra_fields["action"]) == ("", "")
    verl = StepBatch.from_rows(["g", "g"], [r.extra_fields for r in on], [False, False])
    assert verl.actions.tolist() == ["down", "jump!"] and verl.action_valid.tolist() == [True, False]
    local = StepBatch.from_episodes([_episode()], text_chars=30)  # the local engine reads the same rows
    assert local.observations.tolist() == verl.observations.tolist()
    assert local.actions.tolist() == verl.actions.tolist()
    assert StepBatch.from_episodes([_episode()]).actions.tolist() == ["", ""]  # records off: no texts


# ------------------------------------------------------------------------------------------- a real local run
# An easy gridnav variant (as tests/test_local_train.py): groups have mixed outcomes, so the terms are not all 0.
EASY = ["env.kwargs.size=3", "env.kwargs.walls=0", "env.kwargs.min_path=1", "env.max_steps=4"]


def _local_run(model_dir, out_dir, *extra):
    from verl_gigpo.local.train import LocalTrainer, load_config

    cfg = load_config(
        [
            f"actor_rollout_ref.model.path={model_dir}",
            f"trainer.default_local_dir={out_dir}",
            "actor_rollout_ref.rollout.n=4",
            "data.train_batch_size=3",
            "data.val_size=2",
            "trainer.total_training_steps=2",
            "local.progress=false",
            "local.plot=false",
            *EASY,
            *extra,
        ]
    )
    trainer = LocalTrainer(cfg)
    try:
        history = trainer.fit()
    finally:
        trainer.close()
    params = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    return trainer, history, params


@pytest.fixture(scope="module")
def local_runs(tiny_model_dir, tmp_path_factory):
    """The same 2-iteration local run with credit records off and on (every iteration, every group)."""
    root = tmp_path_factory.mktemp("credit-runs")
    off = _local_run(tiny_model_dir, root / "off")
    on = _local_run(tiny_model_dir, root / "on", "trainer.credit_log_freq=1", "trainer.credit_log_groups=-1")
    return root, off, on


def test_records_off_write_nothing_and_train_exactly_as_on(local_runs):
    root, (_, history_off, params_off), (_, history_on, params_on) = local_runs
    assert not (root / "off" / "credit").exists()
    assert sorted(p.name for p in (root / "on" / "credit").iterdir()) == ["iter_1.jsonl", "iter_2.jsonl"]
    assert all(torch.equal(params_off[k], params_on[k]) for k in params_off)

    def comparable(history):  # wall-clock timings differ between runs; everything else must be identical
        return [
            {k: v for k, v in m.items() if not (k.startswith("timing_s/") or k.endswith("_seconds_mean"))}
            for m in history
        ]

    assert comparable(history_off) == comparable(history_on)
    assert history_on[1]["actor/grad_norm"] > 0  # it did train


def test_local_records_are_the_terms_the_update_used(local_runs):
    root, _, (trainer, history, _) = local_runs
    records = read_credit_records(root / "on" / "credit" / "iter_2.jsonl")
    terms = trainer.gigpo_terms  # what the estimator returned in iteration 2, whose advantages the update used
    assert len(records) == len(terms.advantage) == history[2]["rollout/rows"]
    assert history[2]["adv/abs_mean"] == float(np.abs(terms.advantage).mean())
    for attr, key in TERM_FIELDS.items():
        assert [r[key] for r in records] == getattr(terms, attr).tolist(), key
    assert all(r["iteration"] == 2 for r in records)
    assert {r["group"] for r in records} == {"task0", "task1", "task2"}  # the drawn tasks' ids
    assert np.abs([r["step_adv"] for r in records]).max() > 0  # a real signal, not all zeros
    # the estimator on the recorded inputs (hashed keys partition rows like the raw keys) gives the same terms and
    # the gigpo/* metrics logged for iteration 2
    cfg = GiGPOConfig.from_algorithm(trainer.cfg.algorithm)
    again = gigpo_advantage_terms(
        torch.tensor([r["step_reward"] for r in records], dtype=torch.float64),
        torch.ones(len(records), 1),
        np.array([r["group"] for r in records]),
        np.array([r["traj"] for r in records]),
        np.array([r["step"] for r in records]),
        np.array([r["anchor_key"] for r in records], dtype=object),
        **cfg.estimator_kwargs(),
    )
    assert again.advantage.tolist() == [r["advantage"] for r in records]
    assert {k: v for k, v in history[2].items() if k.startswith("gigpo/")} == again.stats
    observations = [r["observation"] for r in records]
    assert all(o.startswith("walls:") and len(o) <= 200 for o in observations)
    assert {r["action"] for r in records if r["action_valid"]} <= {"up", "down", "left", "right"}
    lines = (root / "on" / "credit" / "iter_1.jsonl").read_text().splitlines()
    assert len(lines) == history[1]["rollout/rows"] and json.loads(lines[0])["iteration"] == 1
