"""Evaluation through verl's pipeline: ``EVAL_ONLY=1 CKPT=... bash recipes/run_<env>.sh`` and ``python -m
verl_gigpo.evaluate --engine verl`` compose a ``trainer.val_only`` launch of the recipe (CPU, no Ray here).

What runs inside that launch is tested elsewhere on the real components: the agent-loop worker writing transcripts
(tests/test_verl_agent_loop_trainer.py), the report reading them (tests/test_demo.py), verl's own
``resume_from_path`` loading a checkpoint (tests/test_e2e_verl_cpu.py's resumed launch).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from verl_gigpo.evaluate import EvalOptions, resolve_model, verl_eval_overrides
from verl_gigpo.evaluate.__main__ import main
from verl_gigpo.launch import prepare_launch
from verl_gigpo.preflight import config_problems

ROOT = Path(__file__).resolve().parents[1]


def eval_dry_run(*args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("N_GPUS", "CUDA_VISIBLE_DEVICES", "DEVICE", "SEED")}
    return subprocess.run(
        ["bash", str(ROOT / "recipes" / "run_sokoban.sh"), *args],
        env={**base, "DRY_RUN": "1", "EVAL_ONLY": "1", **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def printed(proc: subprocess.CompletedProcess) -> list[str]:
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if not line.startswith("#")]
    return shlex.split("\n".join(lines).replace("\\\n", " "))


def test_eval_only_runs_the_evaluation_of_ckpt_with_the_recipes_launch(tmp_path):
    proc = eval_dry_run(CKPT="/ckpts/exp/global_step_150", EVAL_EPISODES="4", EVAL_GREEDY="1", EVAL_TASKS="32")
    argv = printed(proc)
    cut = argv.index("--")
    head, launch = argv[:cut], argv[cut + 1 :]
    assert head[1:4] == ["-m", "verl_gigpo.evaluate", "/ckpts/exp/global_step_150"]
    assert head[4:6] == ["--engine", "verl"] and head[head.index("--episodes") + 1] == "4" and "--greedy" in head
    out = head[head.index("--out") + 1]
    assert out == "runs/eval/sokoban_gigpo_Qwen2.5-1.5B-Instruct-global_step_150-test"
    # the recipe's own overrides, with its own task files for the evaluation split and size
    assert "env.name=sokoban" in launch and "trainer.val_only=true" not in launch
    val = next(a for a in launch if a.startswith("data.val_files="))
    assert val.endswith("/eval-test-32/val.parquet")
    assert "--val-size 32" in proc.stdout and "--val-split test" in proc.stdout


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"EVAL_ONLY": "yes"}, "EVAL_ONLY=yes: use EVAL_ONLY=1"),
        ({"EVAL_GREEDY": "true"}, "EVAL_GREEDY=true: use 1"),
        ({"EVAL_EPISODES": "0"}, "EVAL_EPISODES=0 is not a whole number >= 1"),
    ],
)
def test_eval_only_variables_are_checked(env, message):
    proc = eval_dry_run(**env)
    assert proc.returncode == 1 and message in proc.stderr


def test_a_missing_ckpt_is_named_before_anything_runs(tmp_path):
    base = {k: v for k, v in os.environ.items() if k not in ("DRY_RUN", "N_GPUS", "SEED")}
    proc = subprocess.run(
        ["bash", str(ROOT / "recipes" / "run_sokoban.sh")],
        env={**base, "DEVICE": "cpu", "EVAL_ONLY": "1", "CKPT": str(tmp_path / "nope" / "global_step_3")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1 and f"CKPT={tmp_path / 'nope' / 'global_step_3'} does not exist" in proc.stderr


def test_the_launch_is_a_val_only_run_that_passes_preflight(tiny_model_dir, tmp_path):
    """The recipe's overrides plus the evaluation's compose through Hydra into a config preflight accepts: verl's
    val_only, the model, the transcripts folder, the sampling options."""
    argv = printed(eval_dry_run(CKPT=str(tiny_model_dir), DEVICE="cpu"))
    launch = argv[argv.index("--") + 1 :]
    source = resolve_model(tiny_model_dir)
    options = EvalOptions(episodes=3, greedy=True)
    overrides = verl_eval_overrides(source, tmp_path / "out", options)
    with initialize_config_dir(config_dir=str(ROOT / "verl_gigpo" / "config"), version_base=None):
        cfg = compose(config_name="gigpo_trainer", overrides=[*launch, *overrides])
    assert cfg.trainer.val_only and cfg.trainer.val_before_train and cfg.trainer.resume_mode == "disable"
    assert cfg.env.transcript_dir == str(tmp_path / "out" / "transcripts")
    assert cfg.actor_rollout_ref.model.path == str(tiny_model_dir)
    assert cfg.actor_rollout_ref.rollout.val_kwargs.n == 3 and not cfg.actor_rollout_ref.rollout.val_kwargs.do_sample
    paths = [p for p in config_problems(cfg) if "data" not in p]  # the recipe's task files are not written here
    assert paths == []


def test_a_verl_checkpoint_is_loaded_by_verl_and_its_settings_are_not_compared(tmp_path):
    """A checkpoint of another experiment: verl resumes from it (trainer.resume_from_path); under val_only nothing
    trains, so the launch says what it validates instead of comparing training keys."""
    ckpt = tmp_path / "exp" / "global_step_2"
    (ckpt / "actor").mkdir(parents=True)
    (ckpt / "actor" / "fsdp_config.json").write_text(json.dumps({"world_size": 1}))
    source = resolve_model(ckpt)
    assert source.kind == "verl" and source.step == 2
    overrides = verl_eval_overrides(source, tmp_path / "out", EvalOptions())
    assert f"trainer.resume_from_path={ckpt}" in overrides and "trainer.resume_mode=resume_path" in overrides
    with initialize_config_dir(config_dir=str(ROOT / "verl_gigpo" / "config"), version_base=None):
        cfg = compose(config_name="gigpo_trainer", overrides=[*overrides, "trainer.logger=[console]"])
    cfg.trainer.logger = ["console", "file"]  # the evaluation's fresh folder has no metrics of the run's iterations
    plan = prepare_launch(cfg, environ={}, record=False)
    assert plan.resume_step == 2 and plan.metrics == (tmp_path / "out" / "verl" / "metrics.jsonl")
    assert any(f"trainer.val_only: validating the checkpoint {ckpt}" in m for m in plan.messages)
    assert not [m for m in plan.messages if "have no row" in m or "moved" in m], plan.messages
    cfg.trainer.logger = ["console"]
    cfg.trainer.val_only = False  # resuming training from it: the settings check reads the checkpoint's own folder
    plan = prepare_launch(cfg, environ={}, record=False)
    assert any(f"no launch record in {tmp_path / 'exp' / 'launches'}" in m for m in plan.messages)


def test_options_the_launch_owns_are_refused_with_engine_verl(tiny_model_dir, tmp_path, capsys):
    assert main([str(tiny_model_dir), "--engine", "verl", "--split", "valid_unseen", "--out", str(tmp_path / "o")]) == 2
    assert "--split: with --engine verl the tasks, environment and platform are the launch's own" in (
        capsys.readouterr().err
    )
    run = tmp_path / "run" / "checkpoints" / "iter_1"
    run.mkdir(parents=True)
    import torch

    torch.save(
        {"iteration": 1, "model": {}, "config": {"actor_rollout_ref": {"model": {"path": str(tiny_model_dir)}}}},
        run / "state.pt",
    )
    assert main([str(tmp_path / "run"), "--engine", "verl", "--out", str(tmp_path / "o2")]) == 2
    assert "is a local-engine checkpoint: evaluate it with the local engine" in capsys.readouterr().err
