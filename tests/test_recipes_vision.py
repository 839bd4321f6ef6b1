"""CPU tests (dry runs, seconds) of the image recipes: Sokoban's default is the reference's image run, OBSERVATION=text
keeps the text Sokoban, DEVICE=cpu uses the tiny vision model (built when missing), and the card games' recipes
compose the reference's settings (the full rows: tests/test_fidelity.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from recipe_config import compose_recipe
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config

from environments import make_env
from verl_gigpo.verl_glue.cpu import check_cpu_config
from verl_gigpo.verl_glue.preflight import config_problems

ROOT = Path(__file__).resolve().parents[1]


def _dry(recipe: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("N_GPUS", "CUDA_VISIBLE_DEVICES", "DEVICE", "SEED")}
    return subprocess.run(
        ["bash", str(ROOT / "recipes" / f"run_{recipe}.sh")],
        env={**base, "DRY_RUN": "1", **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_sokoban_defaults_to_the_reference_image_run_and_text_keeps_the_text_game():
    cfg, _ = compose_recipe("sokoban")
    assert cfg.actor_rollout_ref.model.path == "Qwen/Qwen2.5-VL-3B-Instruct"
    assert (cfg.env.kwargs.observation, cfg.env.kwargs.tile_size, cfg.env.history_length) == ("image", 16, 0)
    assert (cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n, cfg.env.max_steps) == (32, 8, 15)
    text, _ = compose_recipe("sokoban", OBSERVATION="text")
    assert text.actor_rollout_ref.model.path == "Qwen/Qwen2.5-1.5B-Instruct"
    assert (text.env.kwargs.observation, text.env.history_length) == ("text", 2)
    mine, _ = compose_recipe("sokoban", OBSERVATION="text", MODEL_PATH="/models/qwen", HISTORY_LENGTH="1")
    assert (mine.actor_rollout_ref.model.path, mine.env.history_length) == ("/models/qwen", 1)


def test_device_cpu_uses_the_tiny_vision_model_and_builds_it_when_missing(tmp_path):
    model = ROOT / "artifacts" / "tiny-vl"
    proc = _dry("sokoban", DEVICE="cpu", DATA_DIR=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    if not model.is_dir():  # the build it would run first, before data prep
        build = lines.index("# tiny model (runs: artifacts/tiny-vl is missing):")
        assert lines[build + 1].rstrip().endswith("-m verl_gigpo.dev.tiny_vl_model --out artifacts/tiny-vl")
        assert build < next(i for i, line in enumerate(lines) if "verl_gigpo.data.prepare" in line)
    for override in (
        "actor_rollout_ref.model.path=artifacts/tiny-vl",
        "+env.kwargs.observation=image",
        "+env.kwargs.tile_size=8",
        "actor_rollout_ref.model.trust_remote_code=true",
        "data.trust_remote_code=true",
        "platform=cpu",
    ):
        assert f"    {override} \\" in lines, override
    text = _dry("sokoban", DEVICE="cpu", DATA_DIR=str(tmp_path), OBSERVATION="text")
    assert "    actor_rollout_ref.model.path=artifacts/tiny-model \\" in text.stdout.splitlines()
    assert "trust_remote_code" not in text.stdout and "tiny_vl_model" not in text.stdout


@pytest.mark.parametrize(
    ("game", "model", "tasks", "steps", "iters", "rows"),
    [
        ("ezpoints", "Qwen/Qwen2.5-VL-3B-Instruct", 16, 8, 100, 128),
        ("numberline", "Qwen/Qwen2-VL-2B-Instruct", 16, 10, 20, 16),
        ("blackjack", "Qwen/Qwen2.5-VL-3B-Instruct", 32, 15, 200, 32),
    ],
)
def test_card_recipes_compose_the_reference_runs(game, model, tasks, steps, iters, rows):
    cfg, prep = compose_recipe(game)
    assert (cfg.env.name, cfg.actor_rollout_ref.model.path, cfg.env.kwargs.observation) == (game, model, "image")
    assert (cfg.data.train_batch_size, cfg.env.max_steps, cfg.trainer.total_training_steps) == (tasks, steps, iters)
    assert (cfg.trainer.v1.gigpo_sync.mini_batch_rows, cfg.actor_rollout_ref.rollout.n) == (rows, 8)
    assert (cfg.env.history_length, cfg.env.invalid_action, cfg.algorithm.gigpo.key_mode) == (0, "admissible", "state")
    assert prep[prep.index("--env") + 1] == game


def test_observation_is_refused_where_it_does_not_apply_and_checked_where_it_does():
    proc = _dry("search", OBSERVATION="image")
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[-1] == (
        "error: OBSERVATION=image: search has text observations only; OBSERVATION is for sokoban, ezpoints, "
        "numberline, blackjack"
    )
    proc = _dry("ezpoints", OBSERVATION="pixels")
    assert proc.returncode == 1 and "OBSERVATION=pixels: use image" in proc.stderr
    proc = _dry("sokoban", TILE_SIZE="big")
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[-1].startswith("error: TILE_SIZE=big is not a whole number")


@pytest.mark.parametrize("recipe", ["sokoban", "ezpoints", "numberline", "blackjack"])
@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_image_recipes_pass_verls_and_the_launchs_config_checks(recipe, device, tmp_path):
    cfg, _ = compose_recipe(recipe, DEVICE=device, DATA_DIR=str(tmp_path))
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    assert config_problems(cfg) == []  # python -m verl_gigpo.main's own checks
    env = make_env(cfg.env.name, max_steps=cfg.env.max_steps, **OmegaConf.to_container(cfg.env.kwargs))
    _, info = env.reset(seed=0)
    assert len(info["images"]) == 1  # the environment the agent loop builds from the recipe shows its image
    if device == "cpu":
        check_cpu_config(cfg)
        assert cfg.actor_rollout_ref.model.path == "artifacts/tiny-vl" and cfg.data.max_prompt_length == 512
