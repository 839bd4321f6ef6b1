"""CPU tests of the recipes' logic (recipes/common.sh, recipes/driver.py): the GPU-count default, the checks of
numeric variables, checkpoint retention, and paths with characters that Hydra or JSON treat specially.

Each test runs the real ``bash recipes/run_<env>.sh`` (mostly with ``DRY_RUN=1``) and composes the printed command with
Hydra over verl's own config, as ``python -m verl_gigpo.main`` would. GPUs are simulated by a stand-in ``nvidia-smi``
on PATH that prints what ``nvidia-smi -L`` prints on an 8-GPU machine.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ["alfworld", "webshop", "sokoban", "search"]
# what `nvidia-smi -L` prints on an 8-GPU node (one line per GPU; MIG devices would be indented lines)
NVIDIA_SMI_8 = "".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-0000000{i})\n" for i in range(8))


def compose_gigpo(overrides: list[str]):
    """Compose verl_gigpo/config/gigpo_trainer.yaml (verl's ppo_trainer + ours) with Hydra overrides."""
    with initialize_config_dir(config_dir=str(ROOT / "verl_gigpo" / "config"), version_base=None):
        return compose(config_name="gigpo_trainer", overrides=overrides)


def run_recipe(recipe: str, *args: str, path: str | None = None, **env: str) -> subprocess.CompletedProcess:
    """Run ``bash recipes/run_<recipe>.sh args`` with extra environment variables (``DRY_RUN`` only if given)."""
    ignored = ("DRY_RUN", "N_GPUS", "NNODES", "RAY_ADDRESS", "CUDA_VISIBLE_DEVICES", "SEED")
    base = {k: v for k, v in os.environ.items() if k not in ignored}
    if path is not None:
        base["PATH"] = path
    return subprocess.run(
        [shutil.which("bash"), str(ROOT / "recipes" / f"run_{recipe}.sh"), *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def printed_command(proc: subprocess.CompletedProcess) -> list[str]:
    """The argv of the command a DRY_RUN printed (``<python> -m verl_gigpo.main overrides...``)."""
    assert proc.returncode == 0, proc.stderr
    command = "\n".join(line for line in proc.stdout.splitlines() if not line.startswith("#"))
    argv = shlex.split(command.replace("\\\n", " "))
    assert argv[1:3] == ["-m", "verl_gigpo.main"], argv[:3]
    return argv


def printed_overrides(proc: subprocess.CompletedProcess) -> list[str]:
    """The Hydra overrides of the command a DRY_RUN printed (after ``<python> -m verl_gigpo.main``)."""
    return printed_command(proc)[3:]


def printed_prep_command(proc: subprocess.CompletedProcess) -> list[str]:
    """The data-prep command a DRY_RUN printed as a comment (``# python3 -m verl_gigpo.data.prepare ...``)."""
    lines = [line[2:] for line in proc.stdout.splitlines() if line.startswith("# ") and "data.prepare" in line]
    assert len(lines) == 1, proc.stdout
    return shlex.split(lines[0])


@pytest.fixture
def gpus8(tmp_path) -> str:
    """A PATH whose first entry holds an ``nvidia-smi`` that lists 8 GPUs."""
    tool = tmp_path / "bin" / "nvidia-smi"
    tool.parent.mkdir()
    tool.write_text(f"#!/bin/sh\ncat <<'EOF'\n{NVIDIA_SMI_8}EOF\n")
    tool.chmod(0o755)
    return f"{tool.parent}{os.pathsep}{os.environ['PATH']}"


@pytest.mark.parametrize("recipe", RECIPES)
def test_n_gpus_defaults_to_the_visible_gpus_and_validates(recipe, gpus8):
    """On an 8-GPU machine the recipe trains on 8 GPUs (it used to default to 2), and verl accepts that config."""
    cfg = compose_gigpo(printed_overrides(run_recipe(recipe, path=gpus8, DRY_RUN="1")))
    assert cfg.trainer.n_gpus_per_node == 8
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))


def test_n_gpus_default_follows_cuda_visible_devices(gpus8):
    cfg = compose_gigpo(printed_overrides(run_recipe("sokoban", path=gpus8, DRY_RUN="1", CUDA_VISIBLE_DEVICES="2,5")))
    assert cfg.trainer.n_gpus_per_node == 2
    # the GPU check counts the same way: 4 requested, 2 visible -> stop before anything runs
    proc = run_recipe("sokoban", path=gpus8, N_GPUS="4", CUDA_VISIBLE_DEVICES="2,5")
    assert proc.returncode == 1
    assert "N_GPUS=4 but 2 GPU(s) are visible; set N_GPUS=2" in proc.stderr


def test_explicit_n_gpus_wins_over_the_default(gpus8):
    cfg = compose_gigpo(printed_overrides(run_recipe("webshop", path=gpus8, DRY_RUN="1", N_GPUS="4")))
    assert cfg.trainer.n_gpus_per_node == 4


@pytest.mark.parametrize("value", ["two", "2.5", "0", "-1", "1,2"])
def test_non_integer_n_gpus_is_rejected_with_a_message(value, gpus8):
    """Checked even with DRY_RUN, which used to print a command that Hydra or verl would reject later."""
    proc = run_recipe("sokoban", path=gpus8, DRY_RUN="1", N_GPUS=value)
    assert proc.returncode == 1
    assert f"N_GPUS={value} is not a whole number >= 1; set N_GPUS to the number of GPUs" in proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize("recipe", RECIPES)
def test_checkpoints_kept_are_limited(recipe):
    """verl keeps every full FSDP checkpoint unless trainer.max_actor_ckpt_to_keep is an int (its checkpoint manager
    tests ``isinstance(max_ckpt_to_keep, int)``, so a string would silently keep them all)."""
    cfg = compose_gigpo(printed_overrides(run_recipe(recipe, DRY_RUN="1")))
    keep = cfg.trainer.max_actor_ckpt_to_keep
    assert type(keep) is int and keep == 2
    cfg = compose_gigpo(printed_overrides(run_recipe(recipe, DRY_RUN="1", MAX_CKPTS_TO_KEEP="5")))
    assert cfg.trainer.max_actor_ckpt_to_keep == 5


def test_bad_max_ckpts_to_keep_is_rejected():
    proc = run_recipe("search", DRY_RUN="1", MAX_CKPTS_TO_KEEP="all")
    assert proc.returncode == 1
    assert "MAX_CKPTS_TO_KEEP=all is not a whole number >= 1" in proc.stderr
    assert "trainer.max_actor_ckpt_to_keep=null" in proc.stderr  # how to keep them all instead


# characters Hydra's override grammar or JSON treat specially: a comma (Hydra sweep), double and single quotes, a
# backslash (also right before a quote), a space, "=", and "${" (an OmegaConf interpolation)
ODD_NAMES = ['a,b"c', "it's here", "sp ace=x", "back\\slash\\", "lit${x}eral", "q\\'s"]


@pytest.mark.parametrize("odd", ODD_NAMES)
def test_data_paths_with_odd_characters_reach_hydra_and_json_intact(odd, tmp_path):
    data_dir = str(tmp_path / f"data{odd}")
    games = str(tmp_path / f"games{odd}")
    model = str(tmp_path / f"model{odd}")
    proc = run_recipe("alfworld", DRY_RUN="1", DATA_DIR=data_dir, ALFWORLD_DATA=games, MODEL_PATH=model)
    cfg = compose_gigpo(printed_overrides(proc))
    assert cfg.data.train_files == f"{data_dir}/train.parquet"
    assert cfg.data.val_files == f"{data_dir}/val.parquet"
    assert cfg.env.kwargs.data_path == games
    assert cfg.actor_rollout_ref.model.path == model
    assert cfg.trainer.experiment_name == f"alfworld_gigpo_model{odd}"
    # the data-prep step gets the games folder as JSON, which verl_gigpo.data.prepare parses with json.loads
    prep = printed_prep_command(proc)
    assert prep[prep.index("--out") + 1] == data_dir
    assert json.loads(prep[prep.index("--env-kwargs") + 1]) == {"data_path": games}


def test_retriever_url_with_a_comma_reaches_hydra_intact():
    url = "http://retriever:8000/search?fields=title,text"
    cfg = compose_gigpo(printed_overrides(run_recipe("search", DRY_RUN="1", RETRIEVER_URL=url)))
    assert cfg.env.kwargs.retriever_url == url


@pytest.mark.parametrize("value", ["Qwen/Qwen2.5-1.5B-Instruct", "/models/qwen", "true", "null", "123", "nan"])
def test_plain_values_keep_their_string_type(value, tmp_path):
    """Values that look like other types to Hydra (true, 123, ...) still arrive as strings."""
    cfg = compose_gigpo(printed_overrides(run_recipe("sokoban", DRY_RUN="1", MODEL_PATH=value)))
    assert cfg.actor_rollout_ref.model.path == value


# ------------------------------------------------------------------------ the Python the recipes run (common.sh)
ENVIRONMENT_VARS = ("VIRTUAL_ENV", "CONDA_PREFIX", "PYTHON", "DRY_RUN", "N_GPUS", "CUDA_VISIBLE_DEVICES", "DEVICE")


@pytest.fixture
def repo_with_venv(tmp_path) -> Path:
    """A copy of the recipes in a repository root whose ``.venv/`` is a fresh virtual environment without this
    project (``python -m venv``): running with it fails the check, so a test sees which Python a recipe chose."""
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "recipes", repo / "recipes")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(repo / ".venv")], check=True, timeout=120)
    return repo


def run_copied_recipe(repo: Path, **env: str) -> subprocess.CompletedProcess:
    """``bash <repo>/recipes/run_sokoban.sh`` with no environment active (VIRTUAL_ENV, CONDA_PREFIX and PYTHON
    unset) plus ``env``."""
    base = {k: v for k, v in os.environ.items() if k not in ENVIRONMENT_VARS}
    return subprocess.run(
        [shutil.which("bash"), str(repo / "recipes" / "run_sokoban.sh")],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_repository_venv_is_used_when_no_environment_is_active(repo_with_venv):
    venv_python = repo_with_venv / ".venv" / "bin" / "python"
    proc = run_copied_recipe(repo_with_venv, DRY_RUN="1")
    notes = [line for line in proc.stderr.splitlines() if line.startswith("using ")]
    assert notes == [f"using {venv_python} (no virtual or conda environment is active; set PYTHON to use another)"]
    assert printed_command(proc)[0] == str(venv_python)
    assert printed_prep_command(proc)[0] == str(venv_python)


@pytest.mark.parametrize("active", ["VIRTUAL_ENV", "CONDA_PREFIX"])
def test_an_active_environment_wins_over_the_repository_venv(active, repo_with_venv, tmp_path):
    proc = run_copied_recipe(repo_with_venv, DRY_RUN="1", **{active: str(tmp_path / "env")})
    assert "using " not in proc.stderr
    assert printed_command(proc)[0] == "python3"  # the active environment's python3, first on its PATH
    assert printed_prep_command(proc)[0] == "python3"


def test_an_explicit_python_is_honoured(repo_with_venv, tmp_path):
    """PYTHON wins over .venv/: the run passes the Python check (this test's interpreter has the project) and stops
    at the next one, the missing model, instead of at .venv's missing verl."""
    proc = run_copied_recipe(repo_with_venv, DRY_RUN="1", PYTHON=sys.executable)
    assert printed_command(proc)[0] == sys.executable and "using " not in proc.stderr
    model = tmp_path / "no-model"
    proc = run_copied_recipe(repo_with_venv, PYTHON=sys.executable, DEVICE="cpu", MODEL_PATH=str(model))
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"error: MODEL_PATH={model} is not a model folder")


def test_a_python_without_the_project_stops_the_recipe_with_one_line(repo_with_venv):
    """The new user's case: nothing active, `.venv` lacks the packages (here: a fresh venv), DEVICE=cpu."""
    venv_python = repo_with_venv / ".venv" / "bin" / "python"
    proc = run_copied_recipe(repo_with_venv, DEVICE="cpu")
    assert proc.returncode == 1 and proc.stdout == ""
    using, error = proc.stderr.splitlines()
    assert using.startswith(f"using {venv_python} ")
    assert error.startswith(f"error: {venv_python} (Python {sys.version.split()[0]}, the repository's .venv) cannot ")
    assert "cannot import verl" in error and "set PYTHON=" in error and "docs/gpu.md#install" in error
    # the same Python given explicitly; a DRY_RUN skips the check
    proc = run_copied_recipe(repo_with_venv, DEVICE="cpu", PYTHON=str(venv_python))
    assert proc.returncode == 1 and proc.stderr.splitlines() == [
        error.replace("the repository's .venv", f"PYTHON={venv_python}")
    ]
    assert run_copied_recipe(repo_with_venv, DEVICE="cpu", PYTHON=str(venv_python), DRY_RUN="1").returncode == 0


def test_a_python_with_verl_but_not_this_project_is_told_to_install_it(repo_with_venv, tmp_path):
    """verl importable (a stand-in package on PYTHONPATH) but no verl.plugins entry point: verl would never load the
    plug-in, so the recipe stops and says how to install the project into that Python."""
    (tmp_path / "site" / "verl").mkdir(parents=True)
    (tmp_path / "site" / "verl" / "__init__.py").write_text("")
    # the package itself, without the repository root (whose verl_gigpo.egg-info, written by `pip install -e .`,
    # holds the entry point)
    (tmp_path / "site" / "verl_gigpo").symlink_to(ROOT / "verl_gigpo")
    venv_python = repo_with_venv / ".venv" / "bin" / "python"
    pythonpath = str(tmp_path / "site")
    proc = run_copied_recipe(repo_with_venv, DEVICE="cpu", PYTHON=str(venv_python), PYTHONPATH=pythonpath)
    assert proc.returncode == 1
    [error] = proc.stderr.splitlines()
    assert error.startswith(f"error: {venv_python} (Python ")
    assert "has verl but not this project installed" in error and f"`{venv_python} -m pip install -e .`" in error


def test_a_python_that_is_not_a_command_is_named():
    proc = run_recipe("sokoban", DEVICE="cpu", PYTHON="no-such-python3")
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: PYTHON=no-such-python3 is not a command; run with the Python this project")


def test_seed_sets_the_task_order_seed_and_is_checked():
    """SEED (default 0) is data.seed, the seed of verl's shuffle of the training tasks; not a whole number: refused."""
    for env, seed in (({}, 0), ({"SEED": "5"}, 5)):
        cfg = compose_gigpo(printed_overrides(run_recipe("sokoban", DRY_RUN="1", **env)))
        assert (cfg.data.seed, cfg.data.shuffle) == (seed, True)
    for bad in ("x", "-1", "1.5"):
        proc = run_recipe("sokoban", DRY_RUN="1", SEED=bad)
        assert proc.returncode != 0 and f"SEED={bad} is not a whole number >= 0" in proc.stderr


def test_thinking_sets_the_chat_templates_switch_and_is_checked(monkeypatch):
    """THINKING unset: no switch (the chat template's default); 0 / 1: data.apply_chat_template_kwargs.enable_thinking
    false / true (what Qwen3's template reads; tests/test_chat_template.py renders the prompt); else refused."""
    monkeypatch.delenv("THINKING", raising=False)
    for env, switch in (
        ({}, {}),
        ({"THINKING": "0"}, {"enable_thinking": False}),
        ({"THINKING": "1"}, {"enable_thinking": True}),
    ):
        proc = run_recipe("webshop", DRY_RUN="1", **env)
        cfg = compose_gigpo(printed_overrides(proc))
        assert OmegaConf.to_container(cfg.data.apply_chat_template_kwargs) == switch
    # an override after the recipe's wins
    proc = run_recipe("webshop", "data.apply_chat_template_kwargs.enable_thinking=true", DRY_RUN="1", THINKING="0")
    assert compose_gigpo(printed_overrides(proc)).data.apply_chat_template_kwargs.enable_thinking is True
    for bad in ("yes", "false", "2"):
        proc = run_recipe("webshop", DRY_RUN="1", THINKING=bad)
        assert proc.returncode == 1 and f"THINKING={bad}: use THINKING=0" in proc.stderr
        assert "verl_gigpo.main" not in proc.stdout


def test_dynamic_sets_dynamic_sampling_and_is_checked(monkeypatch):
    """DYNAMIC unset: off (verl's clip range); episode / signal: algorithm.filter_groups with the reference's 10
    generation batches and clip range 0.2 / 0.28, the experiment named after it; signal without a step-credit
    estimator, another value or a bad MAX_GEN_BATCHES: refused before anything is printed."""
    for name in ("DYNAMIC", "MAX_GEN_BATCHES", "CLIP_RATIO_LOW", "CLIP_RATIO_HIGH"):
        monkeypatch.delenv(name, raising=False)
    plain = compose_gigpo(printed_overrides(run_recipe("sokoban", DRY_RUN="1")))
    assert plain.algorithm.filter_groups.enable is False and plain.actor_rollout_ref.actor.clip_ratio_high == 0.2
    for kind in ("episode", "signal"):
        cfg = compose_gigpo(printed_overrides(run_recipe("sokoban", DRY_RUN="1", DYNAMIC=kind)))
        groups = cfg.algorithm.filter_groups
        assert (groups.enable, groups.filter, groups.max_num_gen_batches) == (True, kind, 10)
        assert (cfg.actor_rollout_ref.actor.clip_ratio_low, cfg.actor_rollout_ref.actor.clip_ratio_high) == (0.2, 0.28)
        assert cfg.trainer.experiment_name.startswith(f"sokoban_gigpo_dynamic_{kind}_")
    cfg = compose_gigpo(printed_overrides(run_recipe("search", DRY_RUN="1", DYNAMIC="episode", MAX_GEN_BATCHES="3")))
    assert cfg.algorithm.filter_groups.max_num_gen_batches == 3
    for env, message in (
        ({"DYNAMIC": "yes"}, "DYNAMIC=yes: use DYNAMIC=episode"),
        ({"DYNAMIC": "signal", "ADV_ESTIMATOR": "grpo"}, "DYNAMIC=signal needs a step-credit estimator"),
        ({"DYNAMIC": "episode", "MAX_GEN_BATCHES": "0"}, "MAX_GEN_BATCHES=0 is not a whole number >= 1"),
    ):
        proc = run_recipe("sokoban", DRY_RUN="1", **env)
        assert proc.returncode == 1 and message in proc.stderr and "verl_gigpo.main" not in proc.stdout


# ------------------------------------------------------------------------------------------------------------ LoRA
# what LORA_RANK changes in a composed command (target_modules=all-linear is verl's default as well)
LORA_KEYS = {
    "actor_rollout_ref.model.lora_rank",
    "actor_rollout_ref.model.lora_alpha",
    "actor_rollout_ref.actor.optim.lr",
    "actor_rollout_ref.actor.use_kl_loss",
}


def _flat(cfg) -> dict:
    """Every leaf of a composed config as ``dotted.key -> value`` (lists as tuples)."""
    from omegaconf import OmegaConf

    out = {}

    def walk(node, prefix):
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            else:
                out[f"{prefix}{key}"] = tuple(value) if isinstance(value, list) else value

    walk(OmegaConf.to_container(cfg, resolve=False), "")
    return out


def test_lora_rank_sets_verls_lora_keys_and_the_reference_lora_runs_lr_and_kl(gpus8):
    proc = run_recipe(
        "alfworld", path=gpus8, DRY_RUN="1", LORA_RANK="8", LORA_ALPHA="16", LORA_TARGET_MODULES="q_proj,v_proj"
    )
    cfg = compose_gigpo(printed_overrides(proc))
    model, actor = cfg.actor_rollout_ref.model, cfg.actor_rollout_ref.actor
    assert (model.lora_rank, model.lora_alpha, list(model.target_modules)) == (8, 16, ["q_proj", "v_proj"])
    assert (actor.optim.lr, actor.use_kl_loss) == (3e-6, False)
    assert "LoRA: rank 8, alpha 16, target modules q_proj,v_proj; lr 3e-6, KL loss false" in proc.stderr
    # LORA_ALPHA defaults to the rank and LR / USE_KL_LOSS win over the LoRA defaults
    proc = run_recipe("alfworld", path=gpus8, DRY_RUN="1", LORA_RANK="32", LR="1e-5", USE_KL_LOSS="true")
    cfg = compose_gigpo(printed_overrides(proc))
    model, actor = cfg.actor_rollout_ref.model, cfg.actor_rollout_ref.actor
    assert (model.lora_alpha, model.target_modules, actor.optim.lr, actor.use_kl_loss) == (32, "all-linear", 1e-5, True)


def test_lora_on_device_cpu_changes_only_the_lora_keys(tmp_path):
    """``DEVICE=cpu LORA_RANK=8``: the hf backend serves verl's unmerged adapter itself, so LoRA adds verl's LoRA keys
    and the LoRA runs' lr and KL loss to the CPU command, and its own experiment name, nothing else (no lora.merge).
    Every recipe takes them from the same functions (recipes/driver.py, Recipe.shared_overrides and experiment_setup);
    tests/test_fidelity.py composes each one with LoRA."""
    recipe, env = "sokoban", {"DEVICE": "cpu", "DRY_RUN": "1", "DATA_DIR": str(tmp_path)}
    plain = _flat(compose_gigpo(printed_overrides(run_recipe(recipe, **env))))
    lora_cfg = compose_gigpo(printed_overrides(run_recipe(recipe, LORA_RANK="8", **env)))
    lora = _flat(lora_cfg)
    assert {k for k in plain if plain[k] != lora[k]} == LORA_KEYS | {"trainer.experiment_name"}
    assert lora["trainer.experiment_name"] == f"{plain['trainer.experiment_name']}_lora8"  # a LoRA run's own folder
    model = lora_cfg.actor_rollout_ref.model
    assert (model.lora_rank, model.lora_alpha, model.target_modules, model.lora.merge) == (8, 8, "all-linear", False)
    assert lora_cfg.actor_rollout_ref.rollout.name == "hf"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"LORA_RANK": "x"}, "LORA_RANK=x is not a whole number"),
        ({"LORA_ALPHA": "16"}, "LORA_ALPHA or LORA_TARGET_MODULES is set but LORA_RANK is 0"),
        ({"LORA_RANK": "8", "LORA_ALPHA": "0"}, "LORA_ALPHA=0 is not a whole number >= 1"),
        (
            {"LORA_RANK": "8", "LORA_TARGET_MODULES": "q_proj;v_proj"},
            "LORA_TARGET_MODULES=q_proj;v_proj: use all-linear",
        ),
        ({"USE_KL_LOSS": "yes"}, "USE_KL_LOSS=yes: use true or false"),
        ({"LR": "fast"}, "LR=fast is not a number"),
    ],
)
def test_bad_lora_settings_are_rejected_by_name(env, message):
    proc = run_recipe("webshop", DRY_RUN="1", **env)
    assert proc.returncode == 1 and message in proc.stderr and "verl_gigpo.main" not in proc.stdout


# the keys ADV_ESTIMATOR=<method> changes in each recipe, besides algorithm.adv_estimator and the experiment name
# (recipes/recipe_defaults.py ESTIMATOR_SETTINGS; the values are checked against the authors' runs in test_fidelity.py)
ESTIMATOR_KEYS = {
    ("hgpo", "alfworld"): {
        "algorithm.hgpo.weight_base",
        "algorithm.hgpo.std",
        "trainer.total_training_steps",
        "data.max_prompt_length",
        "env.prompt.overlong",
    },
    ("hgpo", "webshop"): {
        "algorithm.hgpo.weight_base",
        "algorithm.hgpo.std",
        "trainer.total_training_steps",
        "env.max_steps",
        "env.prompt.overlong",
        "env.prompt.history_free_above_chars",
    },
    ("hgpo", "sokoban"): {"algorithm.hgpo.weight_base", "algorithm.hgpo.std"},
    ("graphgpo", "alfworld"): set(),  # omega 0.1 is the default, the rest is GiGPO's recipe
    ("graphgpo", "webshop"): {"algorithm.graphgpo.omega", "algorithm.gigpo.norm", "data.max_prompt_length"},
    ("graphgpo", "sokoban"): {"algorithm.graphgpo.omega", "algorithm.gigpo.norm"},
    ("graphgpo", "search"): set(),
    ("g2po", "alfworld"): {"algorithm.g2po.invalid_penalty", "trainer.total_training_steps"},
}


@pytest.mark.parametrize(("method", "recipe"), list(ESTIMATOR_KEYS))
def test_an_estimator_changes_only_its_authors_settings(method, recipe, tmp_path):
    """ADV_ESTIMATOR=hgpo|graphgpo|g2po changes exactly the keys its authors set differently on that environment."""
    env = {"DRY_RUN": "1", "DATA_DIR": str(tmp_path), "ALFWORLD_DATA": str(tmp_path)}
    gigpo = _flat(compose_gigpo(printed_overrides(run_recipe(recipe, **env))))
    proc = run_recipe(recipe, ADV_ESTIMATOR=method, **env)
    other = _flat(compose_gigpo(printed_overrides(proc)))
    changed = {k for k in gigpo if gigpo[k] != other[k]} - {"algorithm.adv_estimator", "trainer.experiment_name"}
    assert changed == ESTIMATOR_KEYS[(method, recipe)]
    assert f"{method} on {recipe}: its authors' settings" in proc.stderr


def test_an_estimators_settings_yield_to_the_users_and_to_device(tmp_path):
    """The authors' values are defaults: a variable the user sets, and DEVICE=cpu's small run, win over them."""
    env = {"DRY_RUN": "1", "DATA_DIR": str(tmp_path), "ADV_ESTIMATOR": "hgpo"}
    cfg = compose_gigpo(printed_overrides(run_recipe("webshop", MAX_STEPS="12", PROMPT_LENGTH="3000", **env)))
    assert (cfg.env.max_steps, cfg.data.max_prompt_length, cfg.trainer.total_training_steps) == (12, 3000, 160)
    cfg = compose_gigpo(printed_overrides(run_recipe("webshop", DEVICE="cpu", **env)))
    assert (cfg.env.max_steps, cfg.trainer.total_training_steps, cfg.env.prompt.overlong) == (4, 2, "drop_history")
    assert cfg.algorithm.hgpo.weight_base == "depth_plus_one"


def test_a_bad_prompt_length_is_rejected_by_name():
    proc = run_recipe("alfworld", DRY_RUN="1", PROMPT_LENGTH="4k")
    assert proc.returncode == 1 and "PROMPT_LENGTH=4k is not a whole number" in proc.stderr
