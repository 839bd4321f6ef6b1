"""verl's pipeline on CPU with GRPO and a LoRA adapter, end to end: the ``grpo`` launch of
:func:`verl_gigpo.dev.smoke.run_smoke` (``make e2e`` runs it too), ``python -m verl_gigpo.main platform=cpu`` with
``algorithm.adv_estimator=grpo`` and ``actor_rollout_ref.model.lora_rank=8``, ``lora_alpha=16`` (verl's keys, as
``LORA_RANK=8 LORA_ALPHA=16`` in the recipes set them) on gridnav with the tiny action model: validation, iterations
1 and 2 with a checkpoint after each, then its rollout server (Ray actor ``HFGenerationServer``) gets SIGKILL in the
middle of iteration 3 and the launch must stop by itself with one line naming it. One launch for three things (the
GRPO baseline, LoRA, a dying rollout server), on the other pytest worker while ``tests/test_e2e_verl_cpu.py`` runs
the GiGPO launches.

What runs is verl's own LoRA path with nothing replaced: peft's adapter on every linear layer of the FSDP2 actor
(``FSDPEngine._build_lora_module``), the reference policy as the actor with its adapter disabled (no reference worker:
``ref_in_actor``), and verl's default unmerged sync (``model.lora.merge=false``): the base weights once, then the
adapter alone after every update, which the ``hf`` rollout backend merges in float32
(:mod:`verl_gigpo.verl_glue.cpu.hf_rollout`). verl's old-log-prob pass runs on each iteration
(``trainer.v1.gigpo_sync.logprob_check_freq=1``), so iteration 2 logs the gap after the first update; after the last
update the gap is measured here, on a fixed prompt, between the weights the server held and the actor rebuilt with
peft from its checkpoint. The checkpoint is then exported (``python -m verl_gigpo.export``): the adapter merged,
``W + (alpha / r) B A``, with the actor's log-probs.

About 2-3.5 minutes on 2 cores (one launch).
"""

from __future__ import annotations

import math

import pytest
import torch
from launch_checks import one_stop_line, training_rows
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file
from token_logprobs import gridnav_prompt_with_reply, token_log_probs
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl_gigpo.dev.smoke import LORA_ALPHA, LORA_RANK, ROLLOUT_GAP_LIMIT, check_runs, run_smoke, val_metric
from verl_gigpo.export import fsdp_full_state_dict
from verl_gigpo.export import main as export_main
from verl_gigpo.verl_glue.metrics_file import training_steps

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(action_model_dir, tmp_path_factory):
    return run_smoke(tmp_path_factory.mktemp("e2e-grpo-lora"), action_model_dir, estimators=("grpo",))["grpo"]


def test_the_launch_stops_by_itself_and_the_smoke_checks_pass(run, action_model_dir):
    assert run.returncode == 1 and not run.hung, run.output[-3000:]  # its rollout server was killed
    assert check_runs({"grpo": run}, action_model_dir) == []  # what `make e2e` reports, on the same run


def test_each_iteration_logs_finite_training_and_environment_metrics_and_no_gigpo_ones(run):
    rows = training_rows(run)
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        for key in ("env/success_rate", "env/env_error_rate", "episode/num_step_rows", "actor/pg_loss"):
            assert isinstance(row.get(key), int | float) and math.isfinite(row[key]), (row["step"], key)
        assert row["episode/num_step_rows"] > 0 and 0.0 <= row["env/success_rate"] <= 1.0
        assert row["actor/grad_norm"] > 0  # a real update happened
    assert not any(k.startswith("gigpo/") for row in rows for k in row)
    assert [m["step"] for m in run.metrics if val_metric(m)] == [0]  # stopped in iteration 3, before the last


def test_a_killed_rollout_server_stops_the_run_with_one_line_naming_it(run):
    """SIGKILL of the hf rollout server mid-iteration 3: the launch stops by itself, naming the server."""
    kill, line = one_stop_line(run, "rollout server")
    assert kill.cmdline.startswith("ray::HFGenerationServer")
    assert line.startswith("error: a process of the run died: the hf rollout server (Ray actor HFGenerationServer")
    assert f"pid {kill.pid}" in line and "trainer.resume_mode=auto" in line
    assert training_steps(run.metrics) == [1, 2]  # iteration 3 never trained on the batch the death cut short


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


def test_the_lora_launch_logs_a_small_rollout_gap_on_every_iteration(run):
    """Iteration 1: the initial sync (base, then the zero-B adapter); iteration 2: the adapter after the first
    update. The reference policy is the actor without its adapter: equal to it until the first optimizer step (B
    starts at zero), apart from it after: the KL loss is positive in iteration 2 (in iteration 1 it is 0 or, where
    a later mini-batch follows the first optimizer step, small)."""
    rows = training_rows(run)
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        gap = row["training/rollout_probs_diff_max"]
        assert math.isfinite(gap) and gap <= ROLLOUT_GAP_LIMIT, (row["step"], gap)
        assert row["actor/entropy"] > 0  # verl's actor pass ran (no bypass)
    assert rows[0]["actor/kl_loss"] >= 0 and rows[1]["actor/kl_loss"] > 0, [row["actor/kl_loss"] for row in rows]


def test_the_adapter_moves_and_the_server_holds_base_plus_scaled_b_a_after_every_sync(run, action_model_dir):
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


def test_after_the_last_update_the_served_lora_model_gives_the_actors_log_probs(run, action_model_dir):
    ids = gridnav_prompt_with_reply(AutoTokenizer.from_pretrained(action_model_dir))
    actor = _lora_actor(action_model_dir, _lora_checkpoint(run, 2))
    served = AutoModelForCausalLM.from_pretrained(action_model_dir, dtype=torch.float32)
    served.load_state_dict(_served(run, 2), strict=True)
    gap = (token_log_probs(served.eval(), ids) - token_log_probs(actor, ids)).abs().max()
    assert gap <= 1e-5, gap


def test_the_lora_export_merges_the_adapter_and_keeps_the_actors_log_probs(run, action_model_dir, tmp_path, capsys):
    ckpt = run.run_dir / "ckpt"
    out = tmp_path / "hf"
    assert export_main([str(ckpt), "--out", str(out), "--dtype", "float32"]) == 0
    printed = capsys.readouterr().out
    assert f"{ckpt / 'global_step_2' / 'actor'} (verl FSDP checkpoint, step 2; LoRA adapter merged" in printed
    assert f"(rank {LORA_RANK}, alpha {LORA_ALPHA}, 14 layers)" in printed
    exported = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    weights = exported.state_dict()
    state = _lora_checkpoint(run, 2)
    for name in state:
        if name.endswith(".base_layer.weight"):
            plain = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
            torch.testing.assert_close(weights[plain], _merged(state, name), rtol=0, atol=0, msg=plain)
    assert not any("lora" in name for name in weights)  # a plain model: no peft needed to load it
    ids = gridnav_prompt_with_reply(AutoTokenizer.from_pretrained(out))
    diff = (token_log_probs(exported, ids) - token_log_probs(_lora_actor(action_model_dir, state), ids)).abs().max()
    assert diff <= 1e-5, diff
