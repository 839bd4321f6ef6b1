"""CPU tests of ``python -m verl_gigpo.export`` on the local engine's checkpoints, and of what it refuses.

A real local-engine run (one GiGPO iteration of the tiny model on gridnav) writes ``checkpoints/iter_1/state.pt``;
the export must give a Hugging Face folder that ``transformers`` loads offline with exactly the checkpoint's weights
(float32) or their bfloat16 rounding (the default), the start model's tokenizer, chat template and generation
config. verl's FSDP checkpoints are exported in ``tests/test_e2e_verl_cpu.py`` (the e2e launches write them) and
``tests/test_e2e_verl_cpu_grpo_lora.py`` (a LoRA adapter merged).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl_gigpo.export import ExportError, export_checkpoint, main, resolve_checkpoint
from verl_gigpo.local.train import LocalTrainer, load_config


@pytest.fixture(scope="module")
def local_run(tiny_model_dir, tmp_path_factory):
    """A local-engine run folder after one training iteration (its checkpoint iter_1), and the trained weights."""
    out = tmp_path_factory.mktemp("local-run") / "run"
    cfg = load_config(
        [
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            f"trainer.default_local_dir={out}",
            "trainer.total_training_steps=1",
            "data.train_batch_size=3",
            "actor_rollout_ref.rollout.n=4",
            "data.val_size=0",
            "local.progress=false",
            "local.plot=false",
            # a 3x3 gridnav a random policy wins about half the time: mixed returns, so the iteration moves weights
            *["env.kwargs.size=3", "env.kwargs.walls=0", "env.kwargs.min_path=1", "env.max_steps=4"],
        ]
    )
    trainer = LocalTrainer(cfg)
    try:
        trainer.fit()
        trained = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    finally:
        trainer.close()
    assert (out / "checkpoints" / "iter_1" / "state.pt").is_file()
    return out, trained


def _chat_ids(tokenizer):
    messages = [{"role": "user", "content": "You are at (0, 0). The goal is at (2, 1). Reply with one action."}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)


def test_a_local_engine_run_exports_its_trained_weights_and_the_start_models_tokenizer(
    local_run, tiny_model_dir, tmp_path, capsys
):
    run, trained = local_run
    out = tmp_path / "hf"
    assert main([str(run), "--out", str(out), "--dtype", "float32"]) == 0
    printed = capsys.readouterr().out
    assert f"{run / 'checkpoints' / 'iter_1' / 'state.pt'} (local-engine checkpoint, step 1)" in printed
    assert f"to {out}" in printed and "in float32, tokenizer included" in printed
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    assert model.dtype == torch.float32
    exported = model.state_dict()
    assert set(exported) == set(trained)
    for name, tensor in trained.items():
        torch.testing.assert_close(exported[name], tensor, rtol=0, atol=0, msg=name)
    start = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    assert any(not torch.equal(start[k], trained[k]) for k in start)  # the iteration moved the weights
    tokenizer, start_tokenizer = AutoTokenizer.from_pretrained(out), AutoTokenizer.from_pretrained(tiny_model_dir)
    assert tokenizer.chat_template == start_tokenizer.chat_template is not None
    assert _chat_ids(tokenizer) == _chat_ids(start_tokenizer)
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == start_tokenizer.eos_token_id
    config = json.loads((out / "config.json").read_text())
    assert config["dtype"] == "float32" and "attn_implementation" not in config
    assert not list(tmp_path.glob(".hf.partial-*"))  # the staging folder is gone
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask  # a folder's usual mode, not mkdtemp's private 0700


def test_the_default_dtype_is_bfloat16_the_trained_weights_rounded(local_run, tmp_path):
    run, trained = local_run
    result = export_checkpoint(run / "checkpoints" / "iter_1" / "state.pt", tmp_path / "bf16")
    assert (result.dtype, result.source.kind, result.source.step, result.lora) == ("bfloat16", "local", 1, None)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "bf16")
    assert model.dtype == torch.bfloat16
    assert result.num_parameters == sum(p.numel() for p in model.parameters())  # tied embeddings counted once
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(tensor, trained[name].to(torch.bfloat16), rtol=0, atol=0, msg=name)


def test_the_command_writes_no_torch_dtype_deprecation(local_run, tmp_path):
    """verl's merger passes ``torch_dtype=``, which transformers calls deprecated once per process: a fresh one."""
    run, _ = local_run
    cmd = [sys.executable, "-m", "verl_gigpo.export", str(run), "--out", str(tmp_path / "hf")]
    done = subprocess.run(cmd, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "in bfloat16, tokenizer included" in done.stdout
    assert "torch_dtype" not in done.stderr


def test_every_path_to_a_local_checkpoint_resolves_to_the_one_a_resume_would_use(local_run):
    run, _ = local_run
    state = run / "checkpoints" / "iter_1" / "state.pt"
    for path in (run, run / "checkpoints", state.parent, state):
        source = resolve_checkpoint(path)
        assert (source.kind, source.path, source.step) == ("local", state, 1)


def test_a_non_empty_target_is_refused_unless_overwrite(local_run, tmp_path, capsys):
    run, _ = local_run
    out = tmp_path / "taken"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main([str(run), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"--out {out} exists and is not empty" in err and "--overwrite" in err
    assert (out / "notes.txt").read_text() == "mine"
    assert main([str(run), "--out", str(out), "--overwrite"]) == 0
    assert not (out / "notes.txt").exists() and (out / "config.json").is_file()
    (tmp_path / "empty").mkdir()
    assert main([str(run), "--out", str(tmp_path / "empty")]) == 0  # an empty folder is no one's work


def test_what_is_not_a_checkpoint_is_refused_naming_the_path_and_what_to_pass(tmp_path, capsys):
    (tmp_path / "notes").mkdir()
    assert main([str(tmp_path / "notes"), "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'notes'} is not a checkpoint" in err and "global_step_N/actor" in err and "iter_K" in err
    with pytest.raises(ExportError, match="does not exist"):
        resolve_checkpoint(tmp_path / "missing")
    experiment = tmp_path / "experiment"
    (experiment / "global_step_3" / "actor").mkdir(parents=True)
    (experiment / "latest_checkpointed_iteration.txt").write_text("5")
    with pytest.raises(ExportError, match=r"latest_checkpointed_iteration\.txt .*global_step_N"):
        resolve_checkpoint(experiment)
    with pytest.raises(ExportError, match=r"global_step_3 .*actor.*fsdp_config\.json"):
        resolve_checkpoint(experiment / "global_step_3")
    (experiment / "global_step_4.partial" / "actor").mkdir(parents=True)  # a save that did not finish
    with pytest.raises(ExportError, match=r"global_step_4\.partial is not a checkpoint"):
        resolve_checkpoint(experiment / "global_step_4.partial")
    assert not (tmp_path / "hf").exists()


def test_a_hugging_face_folder_is_named_as_one(tiny_model_dir, tmp_path, capsys):
    assert main([str(tiny_model_dir), "--out", str(tmp_path / "hf")]) == 2
    assert f"{tiny_model_dir} is already a Hugging Face model folder" in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()


def test_a_moved_start_model_is_named_and_base_model_replaces_it(local_run, tiny_model_dir, tmp_path):
    run, trained = local_run
    moved = tmp_path / "run"
    shutil.copytree(run, moved)
    state_path = moved / "checkpoints" / "iter_1" / "state.pt"
    state = torch.load(state_path, weights_only=False)
    state["config"]["actor_rollout_ref"]["model"]["path"] = str(tmp_path / "gone")
    torch.save(state, state_path)
    with pytest.raises(ExportError, match=r"model\.path \(.*gone\).*--base-model"):
        export_checkpoint(moved, tmp_path / "hf")
    export_checkpoint(moved, tmp_path / "hf", dtype="float32", base_model=tiny_model_dir)
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").state_dict()
    assert all(torch.equal(exported[k], trained[k]) for k in trained)
