"""verl's pipeline on CPU training a LoRA adapter, end to end: one launch of ``python -m verl_gigpo.main platform=cpu``
with ``actor_rollout_ref.model.lora_rank=8``, ``lora_alpha=16`` (verl's keys, as ``LORA_RANK=8 LORA_ALPHA=16`` in the
recipes set them) on gridnav with the tiny action model, two iterations with a checkpoint after each.

What runs is verl's own LoRA path with nothing replaced: peft's adapter on every linear layer of the FSDP2 actor
(``FSDPEngine._build_lora_module``), the reference policy as the actor with its adapter disabled (no reference worker:
``ref_in_actor``), and verl's default unmerged sync (``model.lora.merge=false``): the base weights once, then the
adapter alone after every update, which the ``hf`` rollout backend merges in float32
(:mod:`verl_gigpo.verl_glue.cpu.hf_rollout`).
The rollout-vs-actor gap is measured on every iteration (``trainer.v1.gigpo_sync.logprob_check_freq=1``: verl's
old-log-prob pass runs and logs ``training/rollout_probs_diff_max``), so on iteration 2 it is the gap after the first
update; after the last update it is measured here, on a fixed prompt, between the weights the server held and the
actor rebuilt with peft from its checkpoint. The checkpoint is then exported (``python -m verl_gigpo.export``): the
adapter merged, ``W + (alpha / r) B A``, with the actor's log-probs.

About 2-3.5 minutes on 2 cores (one launch; 2 alone, 3.5 beside the e2e file's launches).
"""

from __future__ import annotations

import math

import pytest
import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file
from token_logprobs import gridnav_prompt_with_reply, token_log_probs
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl_gigpo.data.prepare import write_task_files
from verl_gigpo.dev.smoke import ROLLOUT_GAP_LIMIT, pipeline_overrides, run_pipeline
from verl_gigpo.export import fsdp_full_state_dict
from verl_gigpo.export import main as export_main

pytestmark = pytest.mark.slow

RANK, ALPHA = 8, 16
SCALE = ALPHA / RANK
LORA = [
    f"actor_rollout_ref.model.lora_rank={RANK}",
    f"actor_rollout_ref.model.lora_alpha={ALPHA}",
    "actor_rollout_ref.model.target_modules=all-linear",
    # verl's old-log-prob pass on every iteration (bypass mode skips it after a launch's first): the gap is logged
    "trainer.v1.gigpo_sync.logprob_check_freq=1",
]


@pytest.fixture(scope="module")
def run(action_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("e2e-lora")
    write_task_files("gridnav", out / "data", train_size=64, val_size=8)
    run_dir = out / "lora"
    overrides = pipeline_overrides(
        model_dir=action_model_dir,
        data_dir=out / "data",
        run_dir=run_dir,
        estimator="gigpo",
        total_steps=2,
        val_before_train=False,
        extra=LORA,
    )
    return run_pipeline("lora", run_dir, overrides)


def _training_rows(run):
    return [m for m in run.metrics if "actor/pg_loss" in m]


def _checkpoint(run, step):
    return fsdp_full_state_dict(run.run_dir / "ckpt" / f"global_step_{step}" / "actor")


def _served(run, step):
    """The weights the rollout server served after its last sync at ``step`` (the dump of that sync)."""
    return load_file(sorted((run.run_dir / "synced_weights").glob(f"sync*_step{step}_replica0.safetensors"))[-1])


def _actor(model_dir, state):
    """The actor as verl's FSDP engine builds it: peft's LoRA on every linear layer, loaded with its checkpoint."""
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules="all-linear"))
    model.load_state_dict(state, strict=True)
    return model.eval()


def test_the_lora_launch_trains_and_the_server_generates_with_the_updated_adapter(run):
    assert run.returncode == 0, "\n".join(run.output.splitlines()[-40:])
    rows = _training_rows(run)
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:  # iteration 1: the initial sync; iteration 2: after the first update
        gap = row["training/rollout_probs_diff_max"]
        assert math.isfinite(gap) and gap <= ROLLOUT_GAP_LIMIT, (row["step"], gap)
        assert row["actor/grad_norm"] > 0 and math.isfinite(row["actor/pg_loss"])
    # the reference policy is the actor without its adapter: equal to it before the first update (B starts at 0)
    assert rows[0]["actor/kl_loss"] == 0.0 and rows[1]["actor/kl_loss"] > 0


def test_the_adapter_moves_and_the_server_holds_base_plus_scaled_b_a_after_every_sync(run, action_model_dir):
    initial = AutoModelForCausalLM.from_pretrained(action_model_dir).state_dict()
    dumps = sorted(p.name for p in (run.run_dir / "synced_weights").glob("*.safetensors"))
    # the base once, then the adapter (zero B) at the start, then the adapter after each update
    assert [name.split("_")[1] for name in dumps] == ["step0", "step0", "step1", "step2"]
    before = None
    for step in (1, 2):
        state = _checkpoint(run, step)
        adapter = {k: v for k, v in state.items() if ".lora_" in k}
        assert len(adapter) == 28  # A and B of 7 linear layers x 2 blocks
        for name, weight in state.items():  # LoRA leaves every other weight alone
            if name not in adapter:
                plain = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
                assert torch.equal(weight, initial[plain]), name
        base = {k: v for k, v in state.items() if ".base_layer." in k}
        served = _served(run, step)
        for name, weight in base.items():
            plain = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
            if not plain.endswith(".weight"):
                continue
            a = adapter[name.replace(".base_layer.weight", ".lora_A.default.weight")]
            b = adapter[name.replace(".base_layer.weight", ".lora_B.default.weight")]
            torch.testing.assert_close(served[plain], weight + SCALE * (b @ a), rtol=0, atol=0, msg=plain)
        lora_b = max(float(v.abs().max()) for k, v in adapter.items() if ".lora_B." in k)
        assert lora_b > 0  # B started at zero: the updates moved it
        if before is not None:
            moved = max(float((adapter[k] - before[k]).abs().max()) for k in adapter)
            assert moved > 0, "iteration 2 left the adapter as it was"
        before = adapter


def test_after_the_last_update_the_served_model_gives_the_actors_log_probs(run, action_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(action_model_dir)
    ids = gridnav_prompt_with_reply(tokenizer)
    actor = _actor(action_model_dir, _checkpoint(run, 2))
    served = AutoModelForCausalLM.from_pretrained(action_model_dir, dtype=torch.float32)
    served.load_state_dict(_served(run, 2), strict=True)
    gap = (token_log_probs(served.eval(), ids) - token_log_probs(actor, ids)).abs().max()
    assert gap <= 1e-5, gap


def test_export_merges_the_adapter_and_keeps_the_actors_log_probs(run, action_model_dir, tmp_path, capsys):
    ckpt = run.run_dir / "ckpt"
    out = tmp_path / "hf"
    assert export_main([str(ckpt), "--out", str(out), "--dtype", "float32"]) == 0
    printed = capsys.readouterr().out
    assert f"{ckpt / 'global_step_2' / 'actor'} (verl FSDP checkpoint, step 2; LoRA adapter merged" in printed
    assert f"(rank {RANK}, alpha {ALPHA}, 14 layers)" in printed
    exported = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    weights = exported.state_dict()
    state = _checkpoint(run, 2)
    for name, weight in state.items():
        if not name.endswith(".base_layer.weight"):
            continue
        plain = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
        a = state[name.replace(".base_layer.weight", ".lora_A.default.weight")]
        b = state[name.replace(".base_layer.weight", ".lora_B.default.weight")]
        torch.testing.assert_close(weights[plain], weight + SCALE * (b @ a), rtol=0, atol=0, msg=plain)
    assert not any("lora" in name for name in weights)  # a plain model: no peft needed to load it
    tokenizer = AutoTokenizer.from_pretrained(out)
    ids = gridnav_prompt_with_reply(tokenizer)
    diff = (token_log_probs(exported, ids) - token_log_probs(_actor(action_model_dir, state), ids)).abs().max()
    assert diff <= 1e-5, diff
