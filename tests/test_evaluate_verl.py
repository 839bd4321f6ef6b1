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
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from verl_gigpo.evaluate import EvalOptions, recorded_launch, resolve_model, verl_eval_overrides
from verl_gigpo.evaluate.__main__ import main
from verl_gigpo.verl_glue.launch import prepare_launch
from verl_gigpo.verl_glue.preflight import config_problems

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
    assert out == "runs/eval/sokoban_gigpo_Qwen2.5-VL-3B-Instruct-global_step_150-test"
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


def _recipe_launch(**env: str) -> list[str]:
    """The overrides `bash recipes/run_sokoban.sh` (CPU settings) passes to python -m verl_gigpo.main."""
    base = {k: v for k, v in os.environ.items() if k not in ("N_GPUS", "CUDA_VISIBLE_DEVICES", "EVAL_ONLY", "SEED")}
    proc = subprocess.run(
        ["bash", str(ROOT / "recipes" / "run_sokoban.sh")],
        env={**base, "DRY_RUN": "1", "DEVICE": "cpu", **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    argv = printed(proc)
    return argv[argv.index("verl_gigpo.main") + 1 :]


def _verl_experiment(tmp_path: Path, launch: list[str], step: int = 2) -> Path:
    """An experiment folder as a recipe's launch leaves it: the launch record python -m verl_gigpo.main writes
    (prepare_launch on the composed config), then checkpoint ``step``'s actor folder (its shards are not read
    here) and verl's pointer to it."""
    folder = tmp_path / "exp"
    overrides = [*launch, f"trainer.default_local_dir={folder}"]
    with initialize_config_dir(config_dir=str(ROOT / "verl_gigpo" / "config"), version_base=None):
        cfg = compose(config_name="gigpo_trainer", overrides=overrides)
    argv = sys.argv
    sys.argv = [str(ROOT / "verl_gigpo" / "main.py"), *overrides]  # as `python -m verl_gigpo.main ...` has it
    try:
        prepare_launch(cfg, environ={})
    finally:
        sys.argv = argv
    actor = folder / f"global_step_{step}" / "actor"
    actor.mkdir(parents=True)
    (actor / "fsdp_config.json").write_text(json.dumps({"world_size": 1}))
    (folder / "latest_checkpointed_iteration.txt").write_text(str(step))  # verl writes it after each save
    return folder / f"global_step_{step}"


def test_a_verl_checkpoint_on_the_local_engine_plays_with_its_launchs_settings(tmp_path):
    """The local engine evaluates a verl checkpoint with the settings its launch record holds: the environment,
    step limit, history, prompt options, reply length and validation sampling of the recipe, the split and task
    count of its val_files, and the whole vocabulary (verl constrains nothing)."""
    from verl_gigpo.data.prepare import write_task_files
    from verl_gigpo.evaluate import local_eval_config, model_settings

    _, val = write_task_files("sokoban", tmp_path / "data", train_size=4, val_size=6)
    launch = [
        *_recipe_launch(MAX_STEPS="7"),
        "env.history_length=3",
        f"data.val_files={val}",
        "actor_rollout_ref.rollout.val_kwargs.temperature=0.3",
    ]
    ckpt = _verl_experiment(tmp_path, launch)
    source = resolve_model(ckpt)
    settings = model_settings(source)
    assert settings.origin.startswith(f"verl launch record {ckpt.parent / 'launches' / 'launch_001.json'}")
    assert "env.transcript_dir" in settings.dropped and "algorithm.use_kl_in_reward" in settings.dropped
    cfg = local_eval_config(source, EvalOptions(), settings)
    assert (cfg.env.name, cfg.env.max_steps, cfg.env.history_length) == ("sokoban", 7, 3)
    assert (cfg.env.invalid_action, cfg.algorithm.gigpo.norm) == ("format", "mean")
    assert (cfg.env.val_split, cfg.data.val_size) == ("test", 6)
    assert cfg.actor_rollout_ref.rollout.val_kwargs.temperature == 0.3
    assert not cfg.local.constrain_to_actions
    recipe = dict(item.split("=", 1) for item in launch)
    assert cfg.data.max_prompt_length == int(recipe["data.max_prompt_length"])
    assert cfg.actor_rollout_ref.rollout.response_length == int(recipe["data.max_response_length"])
    # --engine verl without overrides: the launch's own, from the same record (the evaluation's come after them)
    assert recorded_launch(source) == [*launch, f"trainer.default_local_dir={ckpt.parent}"]
    # the options still win, and --settings reads the same record from the experiment folder
    cfg = local_eval_config(source, EvalOptions(split="train", tasks=3, greedy=True), ckpt.parent)
    assert (cfg.env.val_split, cfg.data.val_size, cfg.env.max_steps) == ("train", 3, 7)
    assert not cfg.actor_rollout_ref.rollout.val_kwargs.do_sample


def test_a_verl_checkpoint_without_a_launch_record_or_bad_settings_stops_before_exporting(tmp_path, capsys):
    """No launch record: the environment and limits are unknown, so the evaluation refuses (naming what to pass)
    before it exports anything; a --settings path that does not exist is named as such."""
    actor = tmp_path / "exp" / "global_step_3" / "actor"
    actor.mkdir(parents=True)
    (actor / "fsdp_config.json").write_text(json.dumps({"world_size": 1}))
    out = tmp_path / "o"
    assert main([str(actor.parent), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'exp' / 'launches'} holds no launch record" in err and "pass --env NAME" in err
    assert main([str(actor.parent), "--settings", str(tmp_path / "nope"), "--out", str(out)]) == 2
    assert f"--settings {tmp_path / 'nope'} does not exist" in capsys.readouterr().err
    assert main([str(actor.parent), "--engine", "verl", "--out", str(out)]) == 2
    assert "--engine verl needs the launch's overrides after --" in capsys.readouterr().err
    assert not out.exists()
    # the config and tokenizer verl saves beside the shards stand for their checkpoint, not for a model
    (actor / "huggingface").mkdir()
    (actor / "huggingface" / "config.json").write_text("{}")
    assert resolve_model(actor / "huggingface").checkpoint == actor.parent


def test_another_split_than_the_runs_takes_its_whole_task_list(alfworld_data, tiny_model_dir):
    """A run validated on 1 task of valid_seen: --split valid_unseen without --tasks plays that split's whole fixed
    list (the run's count belongs to another split), the run's own split keeps the run's count, and a count the
    split does not have is refused naming both."""
    from verl_gigpo.evaluate import local_eval_config
    from verl_gigpo.evaluate.models import RunSettings

    env = {"name": "alfworld", "val_split": "valid_seen", "kwargs": {"data_path": str(alfworld_data)}}
    settings = RunSettings(layer={"env": env, "data": {"val_size": 1}}, origin="a run")
    source = resolve_model(tiny_model_dir)
    cfg = local_eval_config(source, EvalOptions(split="valid_unseen"), settings)
    assert (cfg.env.val_split, cfg.data.val_size) == ("valid_unseen", 2)
    cfg = local_eval_config(source, EvalOptions(split="valid_seen"), settings)
    assert (cfg.env.val_split, cfg.data.val_size) == ("valid_seen", 1)
    settings = RunSettings(layer={"env": env, "data": {"val_size": 3}}, origin="a run")
    with pytest.raises(ValueError, match=r"'valid_seen' has 2 tasks.*\b3\b.*--tasks all"):
        local_eval_config(source, EvalOptions(split="valid_seen"), settings)
