"""The local engine on a tiny real model and the real gridnav environment (CPU-only): one iteration changes the
parameters for every estimator, micro-batching and de-duplication are exact, resume equals an uninterrupted run,
and bad configs fail clearly."""

from __future__ import annotations

import dataclasses
import json
import math
import shlex
import time

import numpy as np
import pytest
import torch

from verl_gigpo.dev.smoke import val_metric
from verl_gigpo.local.cli import main
from verl_gigpo.local.train import LocalTrainer, load_config
from verl_gigpo.local.update import PPOActor
from verl_gigpo.rollout import TaskSpec
from verl_gigpo.rollout.health import SIGNALS
from verl_gigpo.rollout.step_rows import StepBatch
from verl_gigpo.verl_glue.metrics_file import TRAINING_STEP_KEY

# An easy gridnav variant (3x3, no walls, goal 1-2 steps away, 4 steps): a random policy wins about half the
# episodes, so groups have mixed outcomes and the advantages are not all zero.
EASY = ["env.kwargs.size=3", "env.kwargs.walls=0", "env.kwargs.min_path=1", "env.max_steps=4"]


def _cfg(model_dir, out_dir, *extra):
    return load_config(
        [
            f"actor_rollout_ref.model.path={model_dir}",
            f"trainer.default_local_dir={out_dir}",
            "actor_rollout_ref.rollout.n=4",
            "data.train_batch_size=3",
            "data.val_size=4",
            "local.progress=false",
            "local.plot=false",
            *EASY,
            *extra,
        ]
    )


def _params(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("estimator", ["gigpo", "gigpo-similarity", "grpo", "rloo"])
def test_one_iteration_updates_the_model(tiny_model_dir, tmp_path, estimator):
    extra = [f"algorithm.adv_estimator={estimator.split('-')[0]}"]
    if estimator == "gigpo-similarity":  # observation texts grouped by similarity (verl_gigpo.advantage.anchors)
        extra += ["algorithm.gigpo.key_mode=similarity", "algorithm.gigpo.similarity_threshold=0.95"]
    trainer = LocalTrainer(_cfg(tiny_model_dir, tmp_path, *extra))
    try:
        before = _params(trainer.model)
        start = time.perf_counter()
        metrics = trainer.train_step()
        elapsed = time.perf_counter() - start
        after = _params(trainer.model)
    finally:
        trainer.close()
    assert 0 < metrics["env/success_rate"] < 1  # mixed outcomes -> a learning signal
    assert metrics["adv/abs_mean"] > 0
    for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"):
        assert math.isfinite(metrics[key]), key
    assert metrics["actor/grad_norm"] > 0
    assert any(not torch.equal(before[k], after[k]) for k in before)
    # identical (prompt, response-but-last) rows are forwarded once; the actor's log-probs of the sampled
    # tokens equal the server's up to float rounding
    assert metrics["rollout/forward_rows"] < metrics["rollout/rows"]
    assert metrics["rollout/logprob_diff_max"] < 1e-4
    assert metrics["rollout/batch_size_mean"] > 1  # concurrent episodes shared batched generations
    if estimator.startswith("gigpo"):
        assert trainer.episode_config.key_mode == ("observation" if "similarity" in estimator else "state")
        assert metrics["gigpo/num_episode_groups"] == 3
        assert metrics["gigpo/step_group_size_mean"] > 1
    for key in ("timing_s/rollout", "timing_s/generate", "timing_s/env", "timing_s/adv", "timing_s/update"):
        assert metrics[key] > 0, key  # each phase ran and was timed
    # the server generates one batch at a time, inside the rollout phase; the three phases run back to back
    assert metrics["timing_s/generate"] <= metrics["timing_s/rollout"]
    assert metrics["timing_s/rollout"] + metrics["timing_s/adv"] + metrics["timing_s/update"] <= elapsed


def test_micro_batching_and_epochs_with_kl_and_entropy(tiny_model_dir, tmp_path):
    """Micro-batch size 1 and 256 give the same update (losses are normalised by the whole mini-batch);
    two epochs over two mini-batches with a KL term and an entropy bonus run and stay finite."""
    results = []
    for micro in (1, 256):
        cfg = _cfg(
            tiny_model_dir, tmp_path / str(micro), f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}"
        )
        trainer = LocalTrainer(cfg)
        try:
            metrics = trainer.train_step()
            results.append((_params(trainer.model), metrics))
        finally:
            trainer.close()
    (p1, m1), (p2, m2) = results
    # same loss and same gradient (its norm before clipping); parameters are not compared element-wise because
    # Adam's first step moves every weight by +-lr whatever the size of its gradient, so float noise in a
    # near-zero gradient entry can flip a sign
    assert m1["actor/pg_loss"] == pytest.approx(m2["actor/pg_loss"], abs=1e-6)
    assert m1["actor/entropy"] == pytest.approx(m2["actor/entropy"], rel=1e-6)
    assert m1["actor/grad_norm"] == pytest.approx(m2["actor/grad_norm"], rel=1e-5)
    assert m1["actor/grad_norm"] > 0

    cfg = _cfg(
        tiny_model_dir,
        tmp_path / "ppo",
        "actor_rollout_ref.actor.ppo_epochs=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.kl_loss_coef=0.1",
        "actor_rollout_ref.actor.entropy_coeff=0.01",
    )
    trainer = LocalTrainer(cfg)
    try:
        metrics = trainer.train_step()
    finally:
        trainer.close()
    assert metrics["actor/kl_loss"] > 0  # the later optimizer steps move away from the reference
    assert all(math.isfinite(metrics[k]) for k in ("actor/pg_loss", "actor/kl_loss", "actor/ppo_kl"))


def test_mini_batches_of_rows(tiny_model_dir, tmp_path):
    """trainer.v1.gigpo_sync.mini_batch_rows (verl's gigpo_sync key) splits the update into ceil(rows / M) shuffled
    mini-batches of step rows, the count verl's plan gives; ppo_epochs passes reshuffle."""
    from verl_gigpo.verl_glue.trainer import plan_mini_batches

    cfg = _cfg(
        tiny_model_dir,
        tmp_path,
        "trainer.v1.gigpo_sync.mini_batch_rows=5",
        "actor_rollout_ref.actor.ppo_epochs=2",
    )
    trainer = LocalTrainer(cfg)
    try:
        metrics = trainer.train_step()
    finally:
        trainer.close()
    rows = int(metrics["rollout/rows"])
    assert rows > 5 and metrics["update/rows"] == rows
    assert metrics["update/num_mini_batches"] == plan_mini_batches(rows, 5, 1).num_mini_batches == math.ceil(rows / 5)
    assert metrics["update/mini_batch_rows"] <= 5 and math.isfinite(metrics["actor/pg_loss"])
    with pytest.raises(ValueError, match=r"trainer\.v1\.gigpo_sync\.mini_batch_rows=0 .*>= 1"):
        load_config(["trainer.v1.gigpo_sync.mini_batch_rows=0"])


def test_failed_episodes_are_masked_not_dropped(tiny_model_dir, tmp_path):
    """Episodes whose environment raises (tasks with an even seed fail at their second step) keep their row in the
    batch, masked as on verl's engine: counted by episode/num_step_rows and gigpo/num_masked_rows, left out of the
    update's rows and of every statistic."""
    cfg = _cfg(
        tiny_model_dir,
        tmp_path,
        "env.registry.gridnav_stepfault=gigpo_faulty_env:StepFaultyGridNav",
        "env.name=gridnav_stepfault",
        "data.train_batch_size=4",
    )
    trainer = LocalTrainer(cfg)
    try:
        episodes = trainer.rollout(
            [TaskSpec("gridnav_stepfault", s, "train", trainer.env_kwargs) for s in (2, 3)],
            2,
            validation=False,
            iteration=1,
        )
        metrics = trainer.train_step()
    finally:
        trainer.close()
    batch = StepBatch.from_episodes(episodes)
    failed = [ep.env_error is not None for ep in episodes]
    assert failed == [True, True, False, False] and [ep.length for ep in episodes[:2]] == [1, 1]  # step 0 played
    assert batch.row_mask.tolist() == [False] * 2 + [True] * (len(batch) - 2)
    assert batch.group_ids.tolist() == ["task0"] * 2 + ["task1"] * (len(batch) - 2)  # the drawn tasks' ids
    # the iteration: 4 tasks x 4 episodes; each failed episode's row is in the batch, masked
    masked = metrics["gigpo/num_masked_rows"]
    assert 0 < metrics["env/env_error_rate"] < 1 and masked == 16 * metrics["env/env_error_rate"]
    assert metrics["episode/num_step_rows"] == metrics["rollout/rows"] + masked


@pytest.mark.parametrize("constrained", [False, True])
def test_shared_forwards_give_each_row_its_plain_forward_logprobs(tiny_model_dir, constrained):
    """The update's log-probs (de-duplicated inputs, micro-batches of 2, left padding) equal one plain forward per
    row: the rows' rollout log-probs are set to the plain forward's, so ``rollout/logprob_diff_max`` measures the
    gap. Rows 0/1/5 share one input (same prompt, one-token responses), rows 2/3 another (same first token)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    up, down, left = (tok.convert_tokens_to_ids(w) for w in ("up", "down", "left"))
    allowed = sorted({up, down, left, tok.eos_token_id}) if constrained else None
    p0, p1, p2 = (tok.encode(t, add_special_tokens=False) for t in ("Now: goal", "Now: goal: down 2.", "blocked"))
    prompts = [p0, p0, p1, p1, p2, p0]
    responses = [[up], [down], [up, down], [up, left], [left, up, tok.eos_token_id], [up]]

    expected = []
    with torch.no_grad():
        for prompt, response in zip(prompts, responses, strict=True):
            logits = model(input_ids=torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1]  # (R, V)
            if allowed is not None:
                logits = logits[:, allowed]  # (R, V')
            logp = torch.log_softmax(logits.float(), -1)  # (R, V')
            cols = [allowed.index(t) for t in response] if allowed is not None else response
            expected.append(logp.gather(-1, torch.tensor(cols)[:, None]).squeeze(-1).tolist())
    n = len(prompts)
    batch = StepBatch(
        group_ids=np.array(["t0", "t0", "t1", "t1", "t2", "t2"], dtype=object),
        traj_ids=np.array([f"e{i}" for i in range(n)], dtype=object),
        step_ids=np.zeros(n, dtype=np.int64),
        anchor_keys=np.array(["s"] * n, dtype=object),
        step_rewards=np.zeros(n),
        action_valid=np.ones(n, dtype=bool),
        won=np.zeros(n, dtype=bool),
        env_error=np.zeros(n, dtype=bool),
        task_types=np.array([None] * n, dtype=object),
        history_dropped=np.zeros(n, dtype=np.int64),
        row_mask=np.ones(n, dtype=bool),
        prompts=prompts,
        responses=responses,
        rollout_logprobs=expected,
    )
    actor_cfg = load_config(["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"]).actor_rollout_ref.actor
    actor = PPOActor(model, actor_cfg, pad_token_id=tok.pad_token_id, device=torch.device("cpu"), allowed_ids=allowed)
    advantages = np.array([1.0, -1.0, 0.5, -0.5, 1.0, 0.0])
    metrics = actor.update(batch, advantages)
    assert metrics["rollout/rows"] == 6 and metrics["rollout/forward_rows"] == 3
    assert metrics["rollout/logprob_diff_max"] < 1e-5
    assert metrics["actor/grad_norm"] > 0 and math.isfinite(metrics["actor/pg_loss"])
    # a failed episode's row (row_mask False; here a placeholder with no tokens) takes no part in the update
    masked = dataclasses.replace(
        batch.select(np.array([0, 0])), row_mask=np.array([False, True]), env_error=np.array([True, False])
    )
    masked.prompts[0], masked.responses[0], masked.rollout_logprobs[0] = [], [], None
    again = actor.update(masked, np.array([5.0, 1.0]))
    assert again["rollout/rows"] == 1 and again["rollout/forward_rows"] == 1


def test_resume_gives_the_same_run(tiny_model_dir, tmp_path):
    common = ["trainer.test_freq=1", "trainer.save_freq=1"]
    straight = LocalTrainer(_cfg(tiny_model_dir, tmp_path / "a", "trainer.total_training_steps=2", *common))
    try:
        history_a = straight.fit()
        params_a = _params(straight.model)
    finally:
        straight.close()

    first = LocalTrainer(_cfg(tiny_model_dir, tmp_path / "b", "trainer.total_training_steps=1", *common))
    try:
        first.fit()
    finally:
        first.close()
    resumed = LocalTrainer(
        _cfg(tiny_model_dir, tmp_path / "b", "trainer.total_training_steps=2", "trainer.resume=true", *common)
    )
    try:
        history_b = resumed.fit()  # trainer.resume=true: restores iteration 1 (model, optimizer, RNGs, metrics)
        params_b = _params(resumed.model)
    finally:
        resumed.close()

    assert all(torch.equal(params_a[k], params_b[k]) for k in params_a)

    def comparable(history):
        # wall-clock timings (timing_s/*, */env_seconds_mean, */generate_seconds_mean) differ between runs;
        # everything else must be identical
        return [
            {k: v for k, v in m.items() if not (k.startswith("timing_s/") or k.endswith("_seconds_mean"))}
            for m in history
        ]

    assert comparable(history_a) == comparable(history_b)
    assert [m["training_step"] for m in history_b] == [0.0, 1.0, 2.0]
    lines = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert comparable(lines) == comparable(history_b)


def test_config_errors_are_clear(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="sections"):
        load_config(["trainer.no_such_key=1"])
    with pytest.raises(ValueError, match="key=value"):
        load_config(["trainer.seed"])
    with pytest.raises(ValueError, match="adv_estimator"):
        load_config(["algorithm.adv_estimator=ppo"])
    with pytest.raises(ValueError, match="rollout.n"):
        load_config(["actor_rollout_ref.rollout.n=0"])
    with pytest.raises(ValueError, match="temperature=0"):
        load_config(["actor_rollout_ref.rollout.temperature=0"])
    with pytest.raises(ValueError, match="norm"):
        load_config(["algorithm.gigpo.norm=max"])
    with pytest.raises(ValueError, match="tiny_model"):
        LocalTrainer(load_config([f"actor_rollout_ref.model.path={tmp_path / 'missing'}"]))


def test_cli_writes_metrics_plot_and_checkpoint(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    args = [f"actor_rollout_ref.model.path={tiny_model_dir}", f"trainer.default_local_dir={out}",
            "trainer.total_training_steps=1", "data.train_batch_size=2", "actor_rollout_ref.rollout.n=2",
            "data.val_size=2", "local.progress=false", *EASY]  # fmt: skip
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "validation success:" in printed and str(out / "metrics.jsonl") in printed
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["training_step"] for m in lines] == [0.0, 1.0]
    assert "val/success_rate" in lines[0] and "val/success_rate" in lines[1]
    # the run-level keys under verl's names too (its file logger's step, training/global_step, timing_s/step,
    # timing_s/testing and core validation metric), so one reader serves both engines' metrics files
    assert [m["step"] for m in lines] == [0.0, 1.0] and [TRAINING_STEP_KEY in m for m in lines] == [False, True]
    assert [val_metric(m) for m in lines] == ["val-core/gridnav/acc/mean@1"] * 2
    assert all(m["val-core/gridnav/acc/mean@1"] == m["val/success_rate"] for m in lines)
    assert all(m["timing_s/testing"] == m["timing_s/val"] > 0 for m in lines)
    assert 0 < lines[1]["timing_s/step"] < lines[1]["timing_s/iteration"]
    assert np.isfinite(lines[1]["actor/pg_loss"])
    assert (out / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == "1"


# ---------------------------------------------------------------------------------------------- the run folder
def _run(cfg):
    trainer = LocalTrainer(cfg)
    try:
        return trainer.fit()
    finally:
        trainer.close()


def test_resume_checks_the_config_and_sets_a_changed_lr(tiny_model_dir, tmp_path, caplog):
    out = tmp_path / "run"
    _run(_cfg(tiny_model_dir, out, "trainer.total_training_steps=1", "data.val_size=0"))
    lines = (out / "metrics.jsonl").read_text()
    # A key that changes what the run computes: refused before anything is built or written, naming the key.
    with pytest.raises(ValueError, match=r"cannot resume .*env\.name: 'gridnav' -> 'sokoban'.*--allow-config-change"):
        LocalTrainer(_cfg(tiny_model_dir, out, "trainer.resume=true", "data.val_size=0", "env.name=sokoban"))
    assert (out / "metrics.jsonl").read_text() == lines
    # ... unless explicitly allowed.
    LocalTrainer(
        _cfg(
            tiny_model_dir,
            out,
            "trainer.resume=true",
            "data.val_size=0",
            "actor_rollout_ref.actor.clip_ratio=0.3",
            "trainer.allow_config_change=true",
        )  # fmt: skip
    ).close()
    # Keys that may change: total steps (applied) and the lr, which must reach the restored optimizer (its
    # load_state_dict brings back the saved 1e-3).
    resumed = LocalTrainer(
        _cfg(
            tiny_model_dir,
            out,
            "trainer.resume=true",
            "data.val_size=0",
            "trainer.total_training_steps=2",
            "actor_rollout_ref.actor.optim.lr=0.5",
        )  # fmt: skip
    )
    try:
        with caplog.at_level("WARNING", logger="verl_gigpo.local.checkpoint"):
            history = resumed.fit()
        assert [g["lr"] for g in resumed.optimizer.param_groups] == [0.5]
    finally:
        resumed.close()
    assert "actor_rollout_ref.actor.optim.lr: 0.001 in the checkpoint, 0.5 from now on" in caplog.text
    assert [m["training_step"] for m in history] == [0.0, 1.0, 2.0] and history[-1]["actor/lr"] == 0.5
    saved = torch.load(out / "checkpoints" / "iter_2" / "state.pt", weights_only=False)
    assert saved["config"]["actor_rollout_ref"]["actor"]["optim"]["lr"] == 0.5
    assert [g["lr"] for g in saved["optimizer"]["param_groups"]] == [0.5]


def test_a_run_is_never_overwritten_by_accident(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    _run(_cfg(tiny_model_dir, out, "trainer.total_training_steps=2", "trainer.save_freq=1", "data.val_size=0"))
    lines = (out / "metrics.jsonl").read_text()
    (out / "notes.txt").write_text("mine")
    # Starting again without --resume used to truncate metrics.jsonl and move the checkpoint pointer back.
    with pytest.raises(
        ValueError,
        match=r"already holds a run .*3 metrics line\(s\).*\[1, 2\].*--resume.*--overwrite",
    ):  # noqa: E501
        LocalTrainer(_cfg(tiny_model_dir, out, "trainer.total_training_steps=1", "data.val_size=0"))
    args = [
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        f"trainer.default_local_dir={out}",
        "local.progress=false",
    ]
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2 and "already holds a run" in capsys.readouterr().err
    assert (out / "metrics.jsonl").read_text() == lines
    assert (out / "checkpoints" / "latest_checkpointed_iteration.txt").read_text() == "2\n"
    # --overwrite removes the old run's outputs (and nothing else) before the new run writes anything.
    history = _run(
        _cfg(tiny_model_dir, out, "trainer.total_training_steps=1", "data.val_size=0", "trainer.overwrite=true")
    )
    assert [m["training_step"] for m in history] == [0.0, 1.0]
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["iter_1", "latest_checkpointed_iteration.txt"]
    assert (out / "notes.txt").read_text() == "mine"
    with pytest.raises(ValueError, match="contradict"):
        LocalTrainer(_cfg(tiny_model_dir, out, "trainer.resume=true", "trainer.overwrite=true"))


def test_resume_falls_back_to_the_newest_complete_checkpoint(tiny_model_dir, tmp_path, caplog, monkeypatch):
    out = tmp_path / "run"
    _run(_cfg(tiny_model_dir, out, "trainer.total_training_steps=3", "trainer.save_freq=1", "data.val_size=0"))
    ckpts = out / "checkpoints"
    pointer = ckpts / "latest_checkpointed_iteration.txt"

    def resumed_iteration():
        trainer = LocalTrainer(_cfg(tiny_model_dir, out, "trainer.resume=true", "data.val_size=0"))
        try:
            return trainer.load_checkpoint()
        finally:
            trainer.close()

    # A crash between truncating and writing the pointer left it empty: `int('')` failed on resume.
    pointer.write_text("")
    with caplog.at_level("WARNING", logger="verl_gigpo.local.run_folder"):
        assert resumed_iteration() == 3
    assert "is unreadable" in caplog.text and "newest complete checkpoint, iteration 3" in caplog.text
    pointer.write_text("7\n")  # names a checkpoint that is not there
    assert resumed_iteration() == 3
    (ckpts / "iter_3" / "state.pt").rename(ckpts / "iter_3" / "state.pt.tmp")  # a partial checkpoint
    pointer.write_text("3\n")
    assert resumed_iteration() == 2
    (ckpts / "iter_2" / "state.pt").write_bytes(b"PK\x03\x04 truncated")  # unreadable: the next one is used
    assert resumed_iteration() == 1
    # The pointer itself is written atomically: a crash before the rename leaves the previous pointer whole.
    from verl_gigpo.local import run_folder

    monkeypatch.setattr(run_folder.os, "replace", lambda *a: (_ for _ in ()).throw(OSError("crash")))
    with pytest.raises(OSError, match="crash"):
        run_folder.write_latest(ckpts, 9)
    assert pointer.read_text() == "3\n"


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("trainer.save_freq=abc", r"trainer\.save_freq='abc' .*whole number.*checkpoint every N"),
        ("trainer.test_freq=abc", r"trainer\.test_freq='abc' .*whole number.*validate every N"),
        ("trainer.seed=1.5", r"trainer\.seed=1\.5 .*>= 0"),
        ("actor_rollout_ref.actor.grad_clip=x", r"actor_rollout_ref\.actor\.grad_clip='x' .*number"),
        ("env.invalid_action_penalty=.nan", r"env\.invalid_action_penalty=nan .*finite"),
        ("env.invalid_action=strict", r"env\.invalid_action\b.*\['admissible', 'format'\].*'strict'"),
        ("local.plot=2", r"local\.plot=2 .*true or false"),
        ("actor_rollout_ref.rollout.top_p=1.5", r"top_p=1\.5 .*\(0, 1\]"),
    ],
)
def test_numeric_keys_are_checked_before_the_run(override, match):
    # trainer.save_freq=abc used to pass and crash after the first iteration (at `iteration % save_freq`).
    with pytest.raises(ValueError, match=match):
        load_config([override])


def test_validation_sampling_follows_the_rule_verls_path_writes(caplog):
    """val_kwargs.do_sample=false: the local engine's validation requests are greedy (temperature 0, top_p 1,
    top_k -1) whatever val_kwargs.temperature says, as verl's path after apply_validation_sampling; the config check
    says once that the temperature is ignored. do_sample=true: val_kwargs' own settings."""
    from verl_gigpo.local.setup import sampling_params

    val = ["actor_rollout_ref.rollout.val_kwargs.temperature=0.7", "actor_rollout_ref.rollout.val_kwargs.top_p=0.9"]
    with caplog.at_level("INFO", logger="verl_gigpo.local.config"):
        greedy = load_config(["actor_rollout_ref.rollout.val_kwargs.do_sample=false", *val])
    assert "temperature=0.7, top_p=0.9 ignored (greedy)" in caplog.text
    params = sampling_params(greedy, None, validation=True)
    assert (params["temperature"], params["top_p"], params["top_k"]) == (0.0, 1.0, -1)
    sampled = load_config(["actor_rollout_ref.rollout.val_kwargs.do_sample=true", *val])
    params = sampling_params(sampled, None, validation=True)
    assert (params["temperature"], params["top_p"], params["top_k"]) == (0.7, 0.9, -1)
    assert sampling_params(sampled, None, validation=False)["temperature"] == 1.0  # training: rollout.temperature


# ------------------------------------------------------------------------------------------ training-health alarms
# Windows of 4 iterations and a warm-up of 4 so that every signal is checked within these 12-iteration runs.
HEALTH = ["trainer.total_training_steps=12", "trainer.health.window=4", "trainer.health.warmup=4", "data.val_size=2"]


def test_a_fast_collapse_raises_the_entropy_alarm_and_stop_leaves_a_checkpoint_that_resumes(
    tiny_model_dir, tmp_path, caplog
):
    """Full-vocabulary sampling at lr 0.1 from the random-start model: entropy 5.8 -> 0.03 by iteration 7 (one
    invalid reply, always). The entropy alarm fires by iteration 10 (measured: 8); action=stop saves a checkpoint
    there, logs the resume command, and that command continues the run to its end without raising the same alarm
    again. ``flat_groups`` (every group fails from iteration 9) is silenced: the entropy alarm is under test."""
    out = tmp_path / "run"
    collapse = ["local.constrain_to_actions=false", "actor_rollout_ref.actor.optim.lr=0.1"]
    stop = ["trainer.health.action=stop", "trainer.health.ignore=[flat_groups]"]
    cfg = _cfg(tiny_model_dir, out, *HEALTH, *collapse, *stop)
    with caplog.at_level("WARNING", logger="verl_gigpo"):
        history = _run(cfg)
    records = [json.loads(x) for x in (out / "health.jsonl").read_text().splitlines()]
    stopped = history[-1]["training_step"]
    assert "entropy_collapse" in [r["signal"] for r in records] and stopped <= 10
    assert all(r["iteration"] == stopped and r["action"] == "stop" for r in records)
    assert history[-1]["health/entropy_collapse"] == 1.0 and history[-1]["actor/entropy"] < 0.1
    assert (out / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == str(int(stopped))
    (line,) = [r.getMessage() for r in caplog.records if "trainer.health.action=stop" in r.getMessage()]
    command = line.split("resume with: ", 1)[1].split(" (add ", 1)[0]
    assert command.startswith("python -m verl_gigpo.local.train ") and command.endswith(" --resume")
    assert main(shlex.split(command)[3:]) == 0  # the printed command, as a user would paste it
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["training_step"] for m in lines] == list(range(13))  # resumed and finished the 12 iterations
    signals = [json.loads(x)["signal"] for x in (out / "health.jsonl").read_text().splitlines()]
    assert signals.count("entropy_collapse") == 1  # the resumed run replayed the alarm's cool-down


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_healthy_runs_raise_no_alarm(tiny_model_dir, tmp_path, seed):
    """The default settings (actions only, lr 1e-3), the same length and windows as the collapse: no alarm, and
    every signal's health/* key is logged."""
    history = _run(_cfg(tiny_model_dir, tmp_path / "run", *HEALTH, f"trainer.seed={seed}"))
    trained = [m for m in history if "training/global_step" in m]
    assert len(trained) == 12 and all(m["health/alarms_total"] == 0.0 for m in trained)
    assert {f"health/{s}" for s in SIGNALS} <= set(trained[-1])
    assert not (tmp_path / "run" / "health.jsonl").exists()
