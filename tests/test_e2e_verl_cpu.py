"""verl's whole pipeline on CPU, end to end, as users launch it: ``python -m verl_gigpo.main platform=cpu``.

One module-scoped fixture runs the launches of :func:`verl_gigpo.dev.smoke.run_smoke` (what ``make e2e`` runs): verl's
``main_ppo`` -> ``TaskRunnerV1`` -> the ``gigpo_sync`` trainer mode -> FSDP actor and reference workers (gloo) ->
the ``gigpo_env_agent`` agent loop on the ``hf`` rollout backend -> TransferQueue. GiGPO trains with a checkpoint
after every iteration; in iteration 1 one of its environment worker processes gets SIGKILL (the run goes on), and
once its step-2 checkpoint and step 2's metrics are written its agent-loop worker gets SIGKILL mid-iteration 3 (the
launch must stop by itself with one line naming the process); a launch in the same folder with
``algorithm.gigpo.step_advantage_w`` changed must stop before Ray naming the key; a launch with the run's settings
resumes from ``global_step_2`` and trains iterations 3-4; GRPO trains a LoRA adapter (verl's ``lora_rank=8``,
``lora_alpha=16``, the recipes' ``LORA_RANK``/``LORA_ALPHA``) for iterations 1 and 2, and then its rollout server
gets SIGKILL mid-iteration 3 (a stop as above), beside the GiGPO launches (in a folder and a Ray cluster of its own).
Nothing of verl is replaced. The tasks are played by ``gridnav_faulty`` (``tests/helpers``), a gridnav in
environment worker processes whose every 5th reset in a process raises, registered in the workers through
``env.registry``: failed episodes in every iteration must leave the run alive with their rows masked (verl's
old-log-prob step must not fail with ``KeyError('rollout_log_probs')``).

The checkpoints are then exported (``python -m verl_gigpo.export``): the latest one in float32 gives the actor's
log-probs and plays gridnav; the default bfloat16 export holds what verl's own model merger writes; the LoRA run's
merges its adapter, ``W + (alpha / r) B A``, with the actor's log-probs.

The LoRA launch runs verl's own LoRA path with nothing replaced: peft's adapter on every linear layer of the FSDP2
actor (``FSDPEngine._build_lora_module``), the reference policy as the actor with its adapter disabled (no reference
worker: ``ref_in_actor``), and verl's default unmerged sync (``model.lora.merge=false``): the base weights once, then
the adapter alone after every update, which the ``hf`` rollout backend merges in float32
(:mod:`verl_gigpo.verl_glue.cpu.hf_rollout`). verl's old-log-prob pass runs on each of its iterations
(``trainer.v1.gigpo_sync.logprob_check_freq=1``), so iteration 2 logs the gap after the first update; after the last
update the gap is measured here, on a fixed prompt, between the weights the server held and the actor rebuilt with
peft from its checkpoint.

Everything asserted comes from what the runs wrote: the experiment's ``ckpt/metrics.jsonl`` (verl's file logger, the
file docs/runs.md points users to: after the crash and the resume it must hold iterations 1-4 once each), verl's
checkpoints, the weights the rollout server received at each sync, the console log. Its wall time is that of the
three GiGPO launches (the GRPO launch runs beside them): about 3-4 minutes on 2 quiet cores.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file
from token_logprobs import gridnav_prompt_with_reply, token_log_probs
from transformers import AutoModelForCausalLM, AutoTokenizer
from verl.model_merger.base_model_merger import ModelMergerConfig
from verl.model_merger.fsdp_model_merger import FSDPModelMerger

from environments import register_env
from verl_gigpo.dev.smoke import (
    CHANGED_KEY,
    LORA_ALPHA,
    LORA_RANK,
    ROLLOUT_GAP_LIMIT,
    check_runs,
    run_smoke,
    val_metric,
)
from verl_gigpo.evaluate import EvalOptions, evaluate_local
from verl_gigpo.export import export_checkpoint, fsdp_full_state_dict
from verl_gigpo.export import main as export_main
from verl_gigpo.verl_glue.metrics_file import read_metrics, training_steps

pytestmark = pytest.mark.slow

HELPERS = Path(__file__).resolve().parent / "helpers"
FAULTY = "gridnav_faulty"
MINI_BATCH_KEY, MINI_BATCH_ROWS = "trainer.v1.gigpo_sync.mini_batch_rows", 48


@pytest.fixture(scope="module")
def runs(action_model_dir, tmp_path_factory):
    sys.path.insert(0, str(HELPERS))  # the task files are written here, for the registered faulty environment
    try:
        register_env(FAULTY, "gigpo_faulty_env:FaultyGridNavProc")  # in worker processes: one gets killed
        out = tmp_path_factory.mktemp("e2e")
        pythonpath = os.pathsep.join(p for p in (str(HELPERS), os.environ.get("PYTHONPATH", "")) if p)
        settings = {
            "env_name": FAULTY,
            # 48 step rows per optimizer step: ~2 per iteration (verl's own split would take ~6: 16 rows each)
            "extra": [
                f"+env.registry.{FAULTY}=gigpo_faulty_env:FaultyGridNavProc",
                f"{MINI_BATCH_KEY}={MINI_BATCH_ROWS}",
                # 2 environment worker processes: each gets >= 8 of an iteration's 16 resets, so >= 1 fails
                "env.num_workers=2",
            ],
            "env": {"PYTHONPATH": pythonpath, "GIGPO_FAULTY_EVERY": "5"},
        }
        # the GiGPO sequence (crash, refused change, resume) and the GRPO run side by side, each with its own task
        # files, Ray cluster and folder: a launch keeps about one core busy, mostly starting processes one by one
        with ThreadPoolExecutor(max_workers=2) as pool:
            sequences = [
                pool.submit(
                    run_smoke,
                    out / estimator,
                    action_model_dir,
                    estimators=(estimator,),
                    kill_env_worker=estimator == "gigpo",
                    **settings,
                )
                for estimator in ("gigpo", "grpo")
            ]
            return {name: run for sequence in sequences for name, run in sequence.result().items()}
    finally:
        sys.path.remove(str(HELPERS))


def _training_rows(run):
    return [m for m in run.metrics if "actor/pg_loss" in m]


def test_every_launch_ends_as_planned_and_the_smoke_checks_pass(runs, action_model_dir):
    assert set(runs) == {"gigpo", "gigpo_changed", "gigpo_resume", "grpo"}
    for name in ("gigpo", "grpo"):  # a Ray actor of theirs was killed: each stopped by itself, exit status 1
        assert runs[name].returncode == 1 and not runs[name].hung, runs[name].output[-3000:]
    assert runs["gigpo_changed"].returncode == 1
    run = runs["gigpo_resume"]
    assert run.returncode == 0, "gigpo_resume failed; last lines:\n" + "\n".join(run.output.splitlines()[-40:])
    assert check_runs(runs, action_model_dir) == []  # what `make e2e` reports, on the same runs


@pytest.mark.parametrize("name", ["gigpo", "gigpo_resume", "grpo"])
def test_each_iteration_logs_finite_training_and_environment_metrics(runs, name):
    rows = _training_rows(runs[name])
    assert rows, f"{name} logged no training iteration"
    needed = ["env/success_rate", "env/env_error_rate", "episode/num_step_rows", "actor/pg_loss", "actor/grad_norm"]
    if name.startswith("gigpo"):
        needed += ["gigpo/step_group_size_mean", "gigpo/frac_singleton_step_groups", "gigpo/num_masked_rows"]
    for row in rows:
        for key in needed:
            assert isinstance(row.get(key), int | float) and math.isfinite(row[key]), (name, row["step"], key)
        assert row["episode/num_step_rows"] > 0 and 0.0 <= row["env/success_rate"] <= 1.0
        assert row["actor/grad_norm"] > 0  # a real update happened
    if name == "grpo":
        assert not any(k.startswith("gigpo/") for row in rows for k in row)


def test_bypass_mode_recomputes_old_log_probs_only_on_each_launchs_first_iteration(runs):
    """platform=cpu sets algorithm.rollout_correction.bypass_mode=true: the rollout's log-probs are the old ones,
    except on each launch's first iteration (trainer.v1.gigpo_sync.logprob_check_freq), where verl's actor pass runs
    and logs the entropy and the rollout-vs-actor gap."""
    for name in ("gigpo", "gigpo_resume"):  # the LoRA (grpo) launch runs the pass on every iteration: tests below
        rows = _training_rows(runs[name])
        checked = [row["step"] for row in rows if "training/rollout_probs_diff_max" in row]
        assert checked == [rows[0]["step"]], (name, checked)
        assert rows[0]["training/rollout_probs_diff_max"] <= ROLLOUT_GAP_LIMIT and rows[0]["actor/entropy"] > 0
        for row in rows[1:]:  # bypassed: verl copied rollout_log_probs, no actor pass and no entropy
            assert "actor/entropy" not in row and "training/rollout_probs_diff_max" not in row, (name, row["step"])


def test_validation_before_and_after_training(runs):
    def validated_steps(rows):
        return [m["step"] for m in rows if val_metric(m)]

    assert validated_steps(runs["gigpo"].metrics)[0] == 0 and validated_steps(runs["gigpo_resume"].metrics) == [4]
    assert validated_steps(runs["grpo"].metrics) == [0]  # stopped in iteration 3 (its rollout server killed)
    assert validated_steps(read_metrics(runs["gigpo_resume"].metrics_file)) == [0, 4]  # the history keeps step 0
    last = next(m for m in runs["gigpo_resume"].metrics if val_metric(m))
    assert val_metric(last) == f"val-core/{FAULTY}/acc/mean@1" and 0.0 <= last[val_metric(last)] <= 1.0


def test_a_changed_training_key_stops_the_resume_before_ray(runs):
    changed = runs["gigpo_changed"]
    assert "ray init kwargs" not in changed.output  # verl's run_ppo prints this just before ray.init
    assert "error: cannot resume " in changed.output and "Traceback" not in changed.output  # one line
    assert f"in key(s) that change training: {CHANGED_KEY}: 1.0 -> 0.5." in changed.output


def _one_stop_line(run, label):
    """The kill of ``label`` in ``run`` and the launch's only ``error:`` line."""
    kill = run.kill(label)
    assert kill is not None and kill.stopped_after_s is not None, (label, run.kills, run.output[-3000:])
    errors = run.error_lines()
    assert len(errors) == 1, errors
    return kill, errors[0]


def test_a_killed_agent_loop_worker_stops_the_run_with_one_line_naming_it(runs):
    """SIGKILL of the agent-loop worker mid-iteration 3. verl alone would wait forever (its replay buffer polls
    TransferQueue for the worker's rows); the trainer mode's watch stops the launch, naming the process."""
    first = runs["gigpo"]
    kill, line = _one_stop_line(first, "agent-loop worker")
    assert kill.cmdline.startswith("ray::AgentLoopWorkerTQ")
    assert line.startswith("error: a process of the run died: the agent-loop worker (Ray actor AgentLoopWorkerTQ")
    assert f"pid {kill.pid}" in line and "trainer.resume_mode=auto" in line
    assert f"{first.run_dir / 'ckpt' / 'global_step_2'} (iteration 2)" in line
    assert training_steps(first.metrics) == [1, 2]  # iteration 3 was under way: not logged, not checkpointed


def test_a_killed_rollout_server_stops_the_run_with_one_line_naming_it(runs):
    """SIGKILL of the hf rollout server mid-iteration 3: the launch stops by itself, naming the server."""
    run = runs["grpo"]
    kill, line = _one_stop_line(run, "rollout server")
    assert kill.cmdline.startswith("ray::HFGenerationServer")
    assert line.startswith("error: a process of the run died: the hf rollout server (Ray actor HFGenerationServer")
    assert f"pid {kill.pid}" in line and "trainer.resume_mode=auto" in line
    assert training_steps(run.metrics) == [1, 2]  # iteration 3 never trained on the batch the death cut short


def test_a_killed_environment_worker_is_replaced_and_the_run_goes_on(runs):
    """SIGKILL of an environment worker process in iteration 1: it is replaced (the episode whose call was in
    flight fails, masked and counted in env/env_error_rate; instances idle in it are rebuilt by replay) and
    iterations 1 and 2 train."""
    first = runs["gigpo"]
    kill = first.kill("environment worker")
    assert kill is not None and "verl_gigpo.rollout.execution.procworker" in kill.cmdline
    assert re.search(rf"process {kill.pid} died (during|between)", first.output), first.output[-3000:]
    rows = _training_rows(first)
    assert [row["step"] for row in rows] == [1, 2] and all(row["actor/grad_norm"] > 0 for row in rows)


def test_a_killed_run_resumes_from_its_checkpoint_and_its_metrics_hold_iterations_1_to_4_once(runs):
    first, resumed = runs["gigpo"], runs["gigpo_resume"]
    ckpt = first.run_dir / "ckpt"
    assert training_steps(first.metrics)[:2] == [1, 2]  # logged before the kill
    assert f"[verl_gigpo] resuming experiment 'gigpo' from {ckpt / 'global_step_2'}" in resumed.output
    assert f"Resuming from {ckpt / 'global_step_2'}, setting global step to 2" in resumed.output  # verl's own line
    assert training_steps(resumed.metrics) == [3, 4]
    history = read_metrics(ckpt / "metrics.jsonl")  # the file the docs point users to
    assert training_steps(history) == [1, 2, 3, 4]
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "4"
    assert [p.name for p in sorted((ckpt / "launches").iterdir())] == ["launch_001.json", "launch_002.json"]


def test_actor_weights_move_and_the_rollout_server_holds_them_after_every_sync(runs, action_model_dir):
    run_dir = runs["gigpo"].run_dir
    initial = AutoModelForCausalLM.from_pretrained(action_model_dir).state_dict()
    step1 = fsdp_full_state_dict(run_dir / "ckpt" / "global_step_1" / "actor")
    assert max(float((step1[k] - initial[k]).abs().max()) for k in initial) > 0  # iteration 1 changed the actor

    dumps = sorted((run_dir / "synced_weights").glob("*.safetensors"))
    synced = {}
    for dump in dumps:  # sync<NNN>_step<k>_replica0: one file per sync, both launches
        step = int(dump.stem.split("_step")[1].split("_")[0])
        synced.setdefault(step, []).append(load_file(dump))
    assert sorted(synced) == [0, 1, 2, 3, 4] and len(synced[2]) == 2  # step 2: after the update and at resume
    for step, received in synced.items():
        actor = initial if step == 0 else fsdp_full_state_dict(run_dir / "ckpt" / f"global_step_{step}" / "actor")
        for weights in received:
            assert set(weights) == set(actor)
            for name, tensor in weights.items():
                torch.testing.assert_close(tensor, actor[name], rtol=0, atol=0, msg=f"step {step}: {name}")


def test_failed_resets_leave_the_run_alive_with_their_rows_masked(runs):
    rows = _training_rows(runs["gigpo"]) + _training_rows(runs["gigpo_resume"])
    assert all(row["env/env_error_rate"] > 0 for row in rows)  # every iteration had failed episodes
    assert all(row["gigpo/num_masked_rows"] > 0 for row in rows)
    log = runs["gigpo"].output
    assert "gridnav_faulty: injected failure at reset" in log and "KeyError" not in log


def _optimizer_steps(ckpt: Path) -> int:
    """AdamW's step count in verl's optimizer checkpoint: the optimizer steps the actor has taken so far."""
    state = torch.load(ckpt / "actor" / "optim_world_size_1_rank_0.pt", map_location="cpu", weights_only=False)
    counts = {int(param_state["step"]) for param_state in state["state"].values()}
    assert len(counts) == 1, counts
    return counts.pop()


def test_optimizer_steps_per_iteration_follow_the_rows_based_setting(runs):
    run_dir = runs["gigpo"].run_dir
    rows = {m["step"]: m for m in _training_rows(runs["gigpo"]) + _training_rows(runs["gigpo_resume"])}
    taken, before = {}, 0
    for step in (1, 2, 3, 4):
        total = _optimizer_steps(run_dir / "ckpt" / f"global_step_{step}")
        taken[step], before = total - before, total
    for step, metrics in rows.items():
        real_rows = metrics["episode/num_step_rows"]
        assert metrics["update/rows"] == real_rows  # every row of the batch, failed episodes' included
        assert metrics["update/num_mini_batches"] == math.ceil(real_rows / metrics["update/mini_batch_rows"])
        assert metrics["update/mini_batch_rows"] <= MINI_BATCH_ROWS + 15  # rounded up to the micro-batch size, 16
        assert taken[step] == metrics["update/num_mini_batches"] == math.ceil(real_rows / MINI_BATCH_ROWS)
        assert taken[step] < real_rows / 16  # verl's own split: ppo_mini_batch_size (4 tasks) x n (4) = 16 rows


def test_the_last_checkpoint_exports_with_the_actors_log_probs_and_the_export_plays(
    runs, action_model_dir, tmp_path, capsys
):
    """``python -m verl_gigpo.export <experiment folder>``: its latest checkpoint (global_step_4, written by the
    resumed launch) as a Hugging Face folder in float32, whose log-probs on a fixed prompt are the actor's: those of
    the weights the rollout server held after step 4's sync (the actor's checkpoint bit for bit, test above). The
    folder then plays gridnav through the project's generation server, with valid replies as the model was tuned."""
    ckpt = runs["gigpo"].run_dir / "ckpt"
    out = tmp_path / "hf"
    assert export_main([str(ckpt), "--out", str(out), "--dtype", "float32"]) == 0
    assert f"{ckpt / 'global_step_4' / 'actor'} (verl FSDP checkpoint, step 4) to {out}" in capsys.readouterr().out
    tokenizer = AutoTokenizer.from_pretrained(out, local_files_only=True)
    exported = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    actor = AutoModelForCausalLM.from_pretrained(action_model_dir, dtype=torch.float32)
    last_sync = sorted((runs["gigpo"].run_dir / "synced_weights").glob("sync*_step4_replica0.safetensors"))[-1]
    actor.load_state_dict(load_file(last_sync), strict=True)
    ids = gridnav_prompt_with_reply(tokenizer)
    diff = (token_log_probs(exported, ids) - token_log_probs(actor.eval(), ids)).abs().max()
    assert diff <= 1e-6, diff

    # the evaluation takes the checkpoint itself: it plays its float32 export (the folder above) with the settings
    # of the launch that wrote it (its launch record): the registered environment, its step limit, prompt and reply
    # lengths, the run's validation split, and the whole vocabulary as verl sampled
    sys.path.insert(0, str(HELPERS))  # the registered faulty environment's module
    try:
        result = evaluate_local(ckpt, out=tmp_path / "eval", options=EvalOptions(tasks=8), progress=False)
    finally:
        sys.path.remove(str(HELPERS))
    summary = json.loads(result.summary.read_text())
    assert summary["model"].startswith(f"verl checkpoint {ckpt / 'global_step_4'} (step 4), played through its")
    assert summary["settings_from"].startswith(f"verl launch record {ckpt / 'launches'}")
    config = summary["config"]
    assert (config["env"]["name"], config["env"]["max_steps"], config["env"]["val_split"]) == (FAULTY, 6, "test")
    assert config["data"]["max_prompt_length"] == 256 and not config["local"]["constrain_to_actions"]
    assert config["actor_rollout_ref"]["rollout"]["response_length"] == 3
    assert result.overall.episodes + result.overall.env_errors == 8 and result.overall.episodes >= 6
    # measured 0.62 and 0.92 valid replies after the run's 4 iterations; a random-weight model almost never replies
    # validly
    assert result.overall.invalid_rate <= 0.75


def test_the_bfloat16_export_holds_the_weights_verls_model_merger_writes(runs, tmp_path):
    """The default export (bfloat16) of global_step_2 against ``python -m verl.model_merger merge --backend fsdp``
    on the same checkpoint: the same tensors bit for bit, the same tokenizer files and config.json."""
    actor = runs["gigpo"].run_dir / "ckpt" / "global_step_2" / "actor"
    result = export_checkpoint(actor, tmp_path / "ours")
    assert (result.dtype, result.source.step) == ("bfloat16", 2)
    config = ModelMergerConfig(
        operation="merge",
        backend="fsdp",
        local_dir=str(actor),
        target_dir=str(tmp_path / "verl"),
        hf_model_config_path=str(actor / "huggingface"),
    )
    FSDPModelMerger(config).merge_and_save()
    ours = load_file(tmp_path / "ours" / "model.safetensors")
    theirs = load_file(tmp_path / "verl" / "model.safetensors")
    assert set(ours) == set(theirs)
    for name, tensor in theirs.items():
        assert tensor.dtype == torch.bfloat16 and torch.equal(ours[name], tensor), name
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        assert (tmp_path / "ours" / name).read_bytes() == (tmp_path / "verl" / name).read_bytes(), name
    ours_config = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert ours_config == json.loads((tmp_path / "verl" / "config.json").read_text())
    # the training run's attention backend stays in the checkpoint: a folder naming flash-attn would not load without it
    assert json.loads((actor / "huggingface" / "config.json").read_text())["attn_implementation"] == "sdpa"
    assert "attn_implementation" not in ours_config and ours_config["dtype"] == "bfloat16"


# ------------------------------------------------------------------------------------- the LoRA launch (grpo)
SCALE = LORA_ALPHA / LORA_RANK


def _lora_checkpoint(run, step):
    return fsdp_full_state_dict(run.run_dir / "ckpt" / f"global_step_{step}" / "actor")


def _served(run, step):
    """The weights the rollout server served after its last sync at ``step`` (the dump of that sync)."""
    return load_file(sorted((run.run_dir / "synced_weights").glob(f"sync*_step{step}_replica0.safetensors"))[-1])


def _lora_actor(model_dir, state):
    """The actor as verl's FSDP engine builds it: peft's LoRA on every linear layer, loaded with its checkpoint."""
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=LORA_RANK, lora_alpha=LORA_ALPHA, target_modules="all-linear"))
    model.load_state_dict(state, strict=True)
    return model.eval()


def _merged(state, name):
    """``W + (alpha / r) B A`` of the base layer ``name`` (``...base_layer.weight``) of a peft state dict."""
    a = state[name.replace(".base_layer.weight", ".lora_A.default.weight")]
    b = state[name.replace(".base_layer.weight", ".lora_B.default.weight")]
    return state[name] + SCALE * (b @ a)


def test_the_lora_launch_logs_a_small_rollout_gap_on_every_iteration(runs):
    """Iteration 1: the initial sync (base, then the zero-B adapter); iteration 2: the adapter after the first
    update. The reference policy is the actor without its adapter: equal to it until the first optimizer step (B
    starts at zero), apart from it after: the KL loss (a mean over an iteration's ~2 mini-batches) is positive."""
    rows = _training_rows(runs["grpo"])
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        gap = row["training/rollout_probs_diff_max"]
        assert math.isfinite(gap) and gap <= ROLLOUT_GAP_LIMIT, (row["step"], gap)
        assert row["actor/entropy"] > 0  # verl's actor pass ran (no bypass)
    assert all(row["actor/kl_loss"] > 0 for row in rows), [row["actor/kl_loss"] for row in rows]


def test_the_adapter_moves_and_the_server_holds_base_plus_scaled_b_a_after_every_sync(runs, action_model_dir):
    run = runs["grpo"]
    initial = AutoModelForCausalLM.from_pretrained(action_model_dir).state_dict()
    dumps = sorted(p.name for p in (run.run_dir / "synced_weights").glob("*.safetensors"))
    # the base once, then the adapter (zero B) at the start, then the adapter after each update; none in iteration 3
    assert [name.split("_")[1] for name in dumps] == ["step0", "step0", "step1", "step2"]
    before = None
    for step in (1, 2):
        state = _lora_checkpoint(run, step)
        adapter = {k: v for k, v in state.items() if ".lora_" in k}
        assert len(adapter) == 28  # A and B of 7 linear layers x 2 blocks
        for name, weight in state.items():  # LoRA leaves every other weight alone
            if name not in adapter:
                plain = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
                assert torch.equal(weight, initial[plain]), name
        served = _served(run, step)
        for name in state:
            if name.endswith(".base_layer.weight"):
                plain = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
                torch.testing.assert_close(served[plain], _merged(state, name), rtol=0, atol=0, msg=plain)
        assert max(float(v.abs().max()) for k, v in adapter.items() if ".lora_B." in k) > 0  # B started at zero
        if before is not None:
            moved = max(float((adapter[k] - before[k]).abs().max()) for k in adapter)
            assert moved > 0, "iteration 2 left the adapter as it was"
        before = adapter


def test_after_the_last_update_the_served_lora_model_gives_the_actors_log_probs(runs, action_model_dir):
    run = runs["grpo"]
    ids = gridnav_prompt_with_reply(AutoTokenizer.from_pretrained(action_model_dir))
    actor = _lora_actor(action_model_dir, _lora_checkpoint(run, 2))
    served = AutoModelForCausalLM.from_pretrained(action_model_dir, dtype=torch.float32)
    served.load_state_dict(_served(run, 2), strict=True)
    gap = (token_log_probs(served.eval(), ids) - token_log_probs(actor, ids)).abs().max()
    assert gap <= 1e-5, gap


def test_the_lora_export_merges_the_adapter_and_keeps_the_actors_log_probs(runs, action_model_dir, tmp_path, capsys):
    ckpt = runs["grpo"].run_dir / "ckpt"
    out = tmp_path / "hf"
    assert export_main([str(ckpt), "--out", str(out), "--dtype", "float32"]) == 0
    printed = capsys.readouterr().out
    assert f"{ckpt / 'global_step_2' / 'actor'} (verl FSDP checkpoint, step 2; LoRA adapter merged" in printed
    assert f"(rank {LORA_RANK}, alpha {LORA_ALPHA}, 14 layers)" in printed
    exported = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    weights = exported.state_dict()
    state = _lora_checkpoint(runs["grpo"], 2)
    for name in state:
        if name.endswith(".base_layer.weight"):
            plain = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
            torch.testing.assert_close(weights[plain], _merged(state, name), rtol=0, atol=0, msg=plain)
    assert not any("lora" in name for name in weights)  # a plain model: no peft needed to load it
    ids = gridnav_prompt_with_reply(AutoTokenizer.from_pretrained(out))
    diff = (token_log_probs(exported, ids) - token_log_probs(_lora_actor(action_model_dir, state), ids)).abs().max()
    assert diff <= 1e-5, diff
