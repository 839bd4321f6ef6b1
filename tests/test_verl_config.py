"""CPU tests: the Hydra config composes through verl, and every recipe's final command composes and passes verl's own
config validation (``verl.utils.config.validate_config``) — the checks verl runs before it starts Ray — and this
package's (``verl_gigpo.verl_glue.preflight``)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from subprocs import Started
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config

from verl_gigpo.verl_glue.cluster import prepare_ray_init
from verl_gigpo.verl_glue.cpu import check_cpu_config
from verl_gigpo.verl_glue.preflight import config_problems

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = ROOT / "verl_gigpo" / "config"
RECIPES = ["alfworld", "webshop", "sokoban", "search"]


def compose_gigpo(overrides: list[str]):
    """Compose verl_gigpo/config/gigpo_trainer.yaml (verl's ppo_trainer + ours) with Hydra overrides."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name="gigpo_trainer", overrides=overrides)


def dry_run(recipe: str, *args: str, **env: str) -> tuple[list[str], str]:
    """Run ``DRY_RUN=1 bash recipes/run_<recipe>.sh`` and return (argv of the printed command, full stdout)."""
    proc = subprocess.run(
        ["bash", str(ROOT / "recipes" / f"run_{recipe}.sh"), *args],
        env={**{k: v for k, v in os.environ.items() if k not in ("NNODES", "RAY_ADDRESS")}, "DRY_RUN": "1", **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    command = "\n".join(line for line in proc.stdout.splitlines() if not line.startswith("#"))
    return shlex.split(command.replace("\\\n", " ")), proc.stdout


def test_config_declares_gigpo_keys_and_defaults():
    cfg = compose_gigpo([])
    assert cfg.algorithm.adv_estimator == "gigpo"
    assert cfg.algorithm.gamma == 0.95
    assert dict(cfg.algorithm.gigpo) == {
        "step_advantage_w": 1.0,
        "norm": "mean_std",
        "epsilon": 1e-6,
        "episode_stats": "trajectory",
        "key_mode": "observation",
        "similarity_threshold": 0.9,
        "similarity_grouping": "dice_components",
    }
    assert cfg.env.name == "sokoban" and cfg.env.max_steps == 50 and cfg.env.history_length == 2
    assert cfg.trainer.v1.trainer_mode == "gigpo_sync"
    assert cfg.actor_rollout_ref.rollout.agent.default_agent_loop == "gigpo_env_agent"
    # verl's own defaults are still there (the yaml holds only the differences)
    assert cfg.actor_rollout_ref.actor.clip_ratio == 0.2
    assert cfg.data.prompt_key == "prompt"


def test_plain_overrides_work_without_plus():
    cfg = compose_gigpo(
        ["env.name=alfworld", "env.max_steps=7", "algorithm.gigpo.norm=mean", "algorithm.gigpo.key_mode=history:2"]
    )
    assert (cfg.env.name, cfg.env.max_steps, cfg.algorithm.gigpo.norm) == ("alfworld", 7, "mean")
    assert cfg.algorithm.gigpo.key_mode == "history:2"


def test_unknown_gigpo_key_is_rejected_by_struct_mode():
    with pytest.raises(Exception, match="step_weight"):
        compose_gigpo(["algorithm.gigpo.step_weight=2"])


#: the documented entry points (and the older config-name spelling), each asked for its composed config
MAIN_PPO = [sys.executable, "-m", "verl.trainer.main_ppo"]
ENTRY_POINTS = {
    "verl_gigpo.main": [sys.executable, "-m", "verl_gigpo.main"],
    "verl_main_ppo": [*MAIN_PPO, "-cp", "pkg://verl_gigpo.config", "-cn", "gigpo_trainer"],
    "verl_main_ppo_folder_name": [*MAIN_PPO, "-cp", "pkg://verl_gigpo", "-cn", "config/gigpo_trainer"],
}


@pytest.fixture(scope="module")
def entry_points():
    """Each entry point with ``--cfg job`` (it prints the config and stops before Ray), all started at once."""
    started = Started(
        {
            name: [*argv, "algorithm.adv_estimator=gigpo", "env.name=webshop", "--cfg", "job"]
            for name, argv in ENTRY_POINTS.items()
        },
        cwd=ROOT,
    )
    yield started
    started.close()


@pytest.mark.parametrize("name", list(ENTRY_POINTS))
def test_entry_points_compose_with_cfg_job(entry_points, name):
    """The documented entry points (and the older config-name spelling) compose the same config, each in a fresh
    process."""
    proc = entry_points.result(name)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cfg = OmegaConf.create(proc.stdout)
    assert cfg.algorithm.adv_estimator == "gigpo"
    assert cfg.env.name == "webshop"
    assert cfg.trainer.v1.trainer_mode == "gigpo_sync"
    assert cfg.actor_rollout_ref.actor.strategy == "fsdp"  # verl's ppo_trainer underneath


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("estimator", ["gigpo", "grpo"])
def test_recipe_dry_run_composes_and_validates(recipe, estimator):
    argv, stdout = dry_run(recipe, ADV_ESTIMATOR=estimator)
    assert argv[1:3] == ["-m", "verl_gigpo.main"], argv[:3]  # argv[0]: the Python the recipe chose (common.sh)
    assert "verl_gigpo.data.prepare" in stdout  # the data-prep step is part of the recipe
    overrides = argv[3:]
    assert f"algorithm.adv_estimator={estimator}" in overrides
    cfg = compose_gigpo(overrides)
    assert cfg.env.name == recipe
    assert cfg.algorithm.adv_estimator == estimator
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    assert config_problems(cfg) == []  # and python -m verl_gigpo.main's own checks of the GiGPO keys


def test_alfworld_recipe_has_the_paper_settings():
    argv, _ = dry_run("alfworld")
    cfg = compose_gigpo(argv[3:])
    assert cfg.actor_rollout_ref.model.path == "Qwen/Qwen2.5-1.5B-Instruct"
    assert cfg.actor_rollout_ref.rollout.n == 8
    assert cfg.data.train_batch_size == 16
    assert cfg.env.max_steps == 50 and cfg.env.history_length == 2 and cfg.env.invalid_action_penalty == 0.1
    assert cfg.algorithm.gamma == 0.95
    assert cfg.algorithm.gigpo.step_advantage_w == 1.0 and cfg.algorithm.gigpo.norm == "mean_std"
    actor = cfg.actor_rollout_ref.actor
    assert actor.optim.lr == 1e-6
    assert actor.use_kl_loss and actor.kl_loss_coef == 0.01 and actor.kl_loss_type == "low_var_kl"
    assert actor.entropy_coeff == 0.001
    assert cfg.trainer.total_training_steps == 150 and cfg.trainer.test_freq == 5
    assert cfg.data.val_files.endswith("val.parquet")


def test_recipe_extra_overrides_come_last_and_win():
    argv, _ = dry_run("webshop", "env.max_steps=3", "algorithm.gigpo.norm=mean_std")
    assert argv[-2:] == ["env.max_steps=3", "algorithm.gigpo.norm=mean_std"]
    cfg = compose_gigpo(argv[3:])
    assert cfg.env.max_steps == 3 and cfg.algorithm.gigpo.norm == "mean_std"


def test_webshop_and_search_recipes_use_their_paper_settings():
    web = compose_gigpo(dry_run("webshop")[0][3:])
    assert web.env.max_steps == 15 and web.algorithm.gigpo.norm == "mean"
    search = compose_gigpo(dry_run("search")[0][3:])
    assert search.algorithm.gigpo.key_mode == "similarity" and search.algorithm.gigpo.similarity_threshold == 0.9
    assert search.env.max_steps == 4 and search.actor_rollout_ref.rollout.n == 5


def test_recipe_without_gpu_fails_early_with_a_message(tmp_path):
    """Without DRY_RUN and without nvidia-smi on PATH the recipe stops before doing anything."""
    env = {k: v for k, v in os.environ.items() if k != "DRY_RUN"}
    for tool in ("dirname", "basename"):  # the only external tools the recipe needs before its GPU check
        (tmp_path / tool).symlink_to(shutil.which(tool))
    env["PATH"] = str(tmp_path)  # a PATH with no nvidia-smi, even on a GPU machine
    recipe = [shutil.which("bash"), str(ROOT / "recipes" / "run_sokoban.sh")]
    proc = subprocess.run(recipe, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "no NVIDIA GPU is visible" in proc.stderr and "DRY_RUN=1" in proc.stderr and "DEVICE=cpu" in proc.stderr


@pytest.mark.parametrize("recipe", RECIPES)
def test_cpu_recipe_dry_run_selects_the_cpu_platform_with_small_defaults(recipe):
    argv, stdout = dry_run(recipe, DEVICE="cpu")
    cfg = compose_gigpo(argv[3:])
    assert cfg.trainer.device == "cpu" and cfg.actor_rollout_ref.rollout.name == "hf"
    assert cfg.actor_rollout_ref.actor.strategy == "fsdp2" and not cfg.actor_rollout_ref.model.use_remove_padding
    # the image recipes (Sokoban's default, the card games) run the tiny vision model (tests/test_recipes_vision.py)
    assert cfg.actor_rollout_ref.model.path == ("artifacts/tiny-vl" if recipe == "sokoban" else "artifacts/tiny-model")
    assert cfg.data.train_batch_size == 4 and cfg.actor_rollout_ref.rollout.n == 4 and cfg.env.max_steps == 4
    assert cfg.trainer.total_training_steps == 2 and cfg.trainer.n_gpus_per_node == 1
    assert "/verl-gigpo/cpu/" in cfg.data.train_files  # small task files of its own, not the GPU run's
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    assert config_problems(cfg) == []
    check_cpu_config(cfg)  # what python -m verl_gigpo.main checks before selecting the cpu platform


def test_unknown_device_is_rejected():
    env = {**os.environ, "DRY_RUN": "1", "DEVICE": "tpu"}
    proc = subprocess.run(
        ["bash", str(ROOT / "recipes" / "run_sokoban.sh")], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 1 and "DEVICE=tpu: use DEVICE=cuda (GPUs) or DEVICE=cpu" in proc.stderr


@pytest.mark.parametrize(("recipe", "rows"), [("alfworld", 256), ("webshop", 64), ("sokoban", 64), ("search", 512)])
def test_recipes_split_updates_by_step_rows(recipe, rows):
    """Each recipe's optimizer step takes the reference run's ppo_mini_batch_size step rows (its rollout.n is 1)."""
    cfg = compose_gigpo(dry_run(recipe)[0][3:])
    assert cfg.trainer.v1.gigpo_sync.mini_batch_rows == rows and cfg.trainer.v1.gigpo_sync.shuffle_rows
    assert compose_gigpo([]).trainer.v1.gigpo_sync.mini_batch_rows == 256  # the yaml default: the ALFWorld run's


@pytest.mark.parametrize("estimator", ["hgpo", "graphgpo", "g2po"])
def test_successor_estimators_run_through_the_alfworld_recipe(estimator):
    """`ADV_ESTIMATOR=<successor> bash recipes/run_alfworld.sh` composes, passes verl's and this package's checks,
    and reads the successor's section (defaults: the paper's; history and penalty from env)."""
    argv, _ = dry_run("alfworld", ADV_ESTIMATOR=estimator)
    overrides = argv[3:]
    assert f"algorithm.adv_estimator={estimator}" in overrides
    cfg = compose_gigpo(overrides)
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    assert config_problems(cfg) == []
    from verl_gigpo.config import GiGPOConfig

    gigpo = GiGPOConfig.from_algorithm(cfg.algorithm, env=cfg.env)
    assert gigpo.method == estimator
    assert (gigpo.hgpo.history_length, gigpo.g2po.invalid_penalty, gigpo.graphgpo.omega) == (2, 0.1, 0.1)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("algorithm.hgpo.alpha=-1", "algorithm.hgpo.alpha=-1 must be a finite number >= 0"),
        ("algorithm.graphgpo.omega=0", "algorithm.graphgpo.omega=0 must be a number in (0, 1]"),
        ("algorithm.g2po.invalid_penalty=-0.1", "algorithm.g2po.invalid_penalty=-0.1 must be a finite number >= 0"),
        ("+algorithm.graphgpo.gamma=0.1", "unknown algorithm.graphgpo key(s) ['gamma']"),
    ],
)
def test_successor_option_errors_are_found_before_ray_starts(override, message):
    """python -m verl_gigpo.main's preflight reports a bad successor option by its key, whichever estimator runs."""
    problems = config_problems(compose_gigpo(["algorithm.adv_estimator=graphgpo", override]))
    assert len(problems) == 1 and problems[0].startswith(message), problems


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_recipes_train_on_nnodes_ray_nodes_of_the_cluster_at_ray_address(recipe, device):
    """NNODES and N_GPUS set verl's node layout, RAY_ADDRESS the cluster joined; the command composes, passes verl's
    validation and, joining, leaves num_cpus/num_gpus to the cluster's nodes (DEVICE=cpu sets them for one machine)."""
    argv, _ = dry_run(recipe, DEVICE=device, N_GPUS="4", NNODES="2", RAY_ADDRESS="10.0.0.1:6379")
    cfg = compose_gigpo(argv[3:])
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node) == (2, 4)
    assert cfg.ray_kwargs.ray_init.address == "10.0.0.1:6379"
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    assert prepare_ray_init(cfg, environ={}) == "10.0.0.1:6379"
    assert cfg.ray_kwargs.ray_init.get("num_cpus") is None and cfg.ray_kwargs.ray_init.get("num_gpus") is None
    if device == "cpu":
        check_cpu_config(cfg)  # the logical GPUs are the cluster's: no num_gpus needed


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipes_default_to_one_node_and_a_local_ray(recipe):
    argv, _ = dry_run(recipe, DEVICE="cpu")
    cfg = compose_gigpo(argv[3:])
    assert (cfg.trainer.nnodes, cfg.ray_kwargs.ray_init.address) == (1, None)
    assert not any(arg.startswith("ray_kwargs.") for arg in argv)
