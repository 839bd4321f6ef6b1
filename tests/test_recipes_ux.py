"""CPU tests of what a recipe says before it starts anything (recipes/common.sh): ADV_ESTIMATOR and DRY_RUN are checked,
bad values stop the recipe before the data-prep line is printed, and ALFWORLD_DATA's messages.

Each test runs the real ``bash recipes/run_<env>.sh``. Runs that are not dry runs see 8 GPUs through a stand-in
``nvidia-smi`` and run a stand-in Python (``PYTHON``): its one-line checks (``-c``) run in this interpreter, and a
module run (``-m``: data prep, ``verl_gigpo.main``) is reported and exits 97 instead, so a test sees how far the
recipe got and nothing launches.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from verl_gigpo import STEP_CREDIT_ESTIMATORS
from verl_gigpo.advantage.outcome import OUTCOME_ESTIMATORS

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ["alfworld", "webshop", "sokoban", "search"]
NVIDIA_SMI_8 = "".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-0000000{i})\n" for i in range(8))
#: the exit status and line of the stand-in Python when a recipe gets as far as running a module
MODULE_RUN, MODULE_RUN_LINE = 97, "stand-in python: would run -m "
#: variables the recipes read that are not theirs to document: the shell's and other tools' (Python environments,
#: CUDA, Hugging Face), and ROLLOUT_NAME, which gigpo_device_setup sets from DEVICE
NOT_RECIPE_SETTINGS = {"CONDA_PREFIX", "VIRTUAL_ENV", "CUDA_VISIBLE_DEVICES", "HF_HUB_OFFLINE", "HOME", "ROLLOUT_NAME"}


def recipe_variables() -> set[str]:
    """Every variable the recipes read with a default or a test (``${NAME:-...}``, ``${NAME:+...}``, ``${NAME+...}``)
    in recipes/*.sh, less :data:`NOT_RECIPE_SETTINGS`."""
    text = "".join(path.read_text() for path in sorted((ROOT / "recipes").glob("*.sh")))
    return set(re.findall(r"\$\{([A-Z][A-Z0-9_]*):?[-+]", text)) - NOT_RECIPE_SETTINGS


def run(recipe: str, *args: str, root: Path = ROOT, **env: str) -> subprocess.CompletedProcess:
    """``bash <root>/recipes/run_<recipe>.sh args`` with ``env`` and none of the recipe variables of the caller's
    environment (so that, e.g., an exported TOTAL_ITERS cannot change a test)."""
    base = {k: v for k, v in os.environ.items() if k not in recipe_variables() | {"CUDA_VISIBLE_DEVICES"}}
    return subprocess.run(
        [shutil.which("bash"), str(root / "recipes" / f"run_{recipe}.sh"), *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def machine(tmp_path) -> dict[str, str]:
    """The environment of a run that is not a dry run, on a stand-in 8-GPU machine with the stand-in Python (module
    docstring), a local model folder and an ALFWorld data folder (empty ``json_2.1.1/``)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\ncat <<'EOF'\n{NVIDIA_SMI_8}EOF\n")
    python = bin_dir / "python"
    python.write_text(
        f'#!/bin/sh\nif [ "$1" = "-c" ]; then exec {shlex.quote(sys.executable)} "$@"; fi\n'
        f'echo "stand-in python: would run $*" >&2\nexit {MODULE_RUN}\n'
    )
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    (tmp_path / "model").mkdir()
    (tmp_path / "alfworld" / "json_2.1.1").mkdir(parents=True)
    return {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHON": str(python),
        "PYTHONPATH": str(ROOT),
        "MODEL_PATH": str(tmp_path / "model"),
        "ALFWORLD_DATA": str(tmp_path / "alfworld"),
        "DATA_DIR": str(tmp_path / "data"),
    }


def checkpointed(folder: Path, *steps: int, pointer: str | None = None) -> Path:
    """``folder`` as verl leaves it: ``global_step_K/`` for each step, and ``latest_checkpointed_iteration.txt``
    holding ``pointer`` (default: the last step as verl writes it; ``"absent"``: no such file)."""
    folder.mkdir(parents=True, exist_ok=True)
    for step in steps:
        (folder / f"global_step_{step}" / "actor").mkdir(parents=True)
    if pointer is None:
        pointer = str(steps[-1])
    if pointer != "absent":
        (folder / "latest_checkpointed_iteration.txt").write_text(pointer)
    return folder


def printed_overrides(proc: subprocess.CompletedProcess) -> list[str]:
    """The Hydra overrides of the command a dry run printed."""
    assert proc.returncode == 0, proc.stderr
    command = "\n".join(line for line in proc.stdout.splitlines() if not line.startswith("#"))
    argv = shlex.split(command.replace("\\\n", " "))
    assert argv[1:3] == ["-m", "verl_gigpo.main"], argv[:3]
    return argv[3:]


# -------------------------------------------------------------------------------------------- 2. ADV_ESTIMATOR
def test_an_unknown_adv_estimator_stops_the_recipe_naming_the_known_ones():
    """The list the recipe names is this package's step-credit estimators and the outcome baselines its trainer mode
    computes, each registered in verl (through the plug-in)."""
    proc = run("alfworld", DRY_RUN="1", ADV_ESTIMATOR="gipgo")
    assert proc.returncode == 1 and proc.stdout == ""
    error = proc.stderr.splitlines()[-1]
    match = re.search(r"ADV_ESTIMATOR=gipgo is not an estimator of the recipes; use one of ([a-z0-9, ]+) \(", error)
    assert match, error
    named = match.group(1).split(", ")
    assert sorted(named) == sorted([*STEP_CREDIT_ESTIMATORS, *OUTCOME_ESTIMATORS])
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY

    import verl_gigpo.plugin  # noqa: F401  - registers this package's estimators (core_algos is imported: at once)

    assert set(named) <= set(ADV_ESTIMATOR_REGISTRY)
    assert "algorithm.adv_estimator=NAME" in error  # how to run another of verl's estimators


# ------------------------------------------------------------------------------------------------- 4. messages
@pytest.mark.parametrize("value", ["yes", "true", "false", "2"])
def test_dry_run_takes_0_or_1_only(value):
    proc = run("sokoban", DRY_RUN=value)
    assert proc.returncode == 1 and proc.stdout == ""
    assert f"DRY_RUN={value}: use DRY_RUN=1" in proc.stderr and "or DRY_RUN=0" in proc.stderr


@pytest.mark.parametrize("value", ["0", ""])
def test_dry_run_0_or_empty_runs(value, machine):
    proc = run("sokoban", DRY_RUN=value, **machine)
    assert proc.returncode == MODULE_RUN and f"{MODULE_RUN_LINE}verl_gigpo.data.prepare" in proc.stderr


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"LORA_RANK": "-1"}, "LORA_RANK=-1 is not a whole number >= 0"),
        ({"SEED": "x"}, "SEED=x is not a whole number >= 0"),
        ({"TOTAL_ITERS": "many"}, "TOTAL_ITERS=many is not a whole number >= 1"),
        ({"LOGGER": "console;file"}, "LOGGER=console;file is not a comma-separated list"),
        ({"MICRO_BATCH_PER_GPU": "0"}, "MICRO_BATCH_PER_GPU=0 is not a whole number >= 1"),
        ({"THINKING": "off"}, "THINKING=off: use THINKING=0"),
        ({"ATTN_IMPLEMENTATION": "flash3"}, "ATTN_IMPLEMENTATION=flash3: use auto"),
        ({"ADV_ESTIMATOR": "gipgo"}, "ADV_ESTIMATOR=gipgo is not an estimator"),
    ],
)
@pytest.mark.parametrize("recipe", ["alfworld", "search"])
def test_a_bad_value_stops_a_dry_run_before_the_data_prep_line(recipe, env, message):
    """The error is the last line of stderr and nothing was printed on stdout (the data-prep line comes later)."""
    proc = run(recipe, DRY_RUN="1", **env)
    assert proc.returncode == 1 and proc.stdout == ""
    assert message in proc.stderr.splitlines()[-1]


def test_alfworld_data_that_does_not_exist_is_named_with_how_to_get_it(machine, tmp_path):
    proc = run("alfworld", **{**machine, "ALFWORLD_DATA": "/nope"})
    assert proc.returncode == 1 and MODULE_RUN_LINE not in proc.stderr
    error = proc.stderr.splitlines()[-1]
    assert "ALFWORLD_DATA=/nope does not exist" in error
    assert "holds json_2.1.1/ (the games) and logic/" in error
    assert "alfworld-download" in error and "-m environments.alfworld.synth --out DIR" in error
    (tmp_path / "empty").mkdir()
    proc = run("alfworld", **{**machine, "ALFWORLD_DATA": str(tmp_path / "empty")})
    assert f"ALFWORLD_DATA={tmp_path / 'empty'} has no json_2.1.1/ folder" in proc.stderr.splitlines()[-1]
