"""CPU tests of what a recipe says before it starts anything (recipes/common.sh, recipes/driver.py): a finished
experiment stops the launch (with the evaluation command to run instead), ADV_ESTIMATOR and DRY_RUN are checked, CKPT
without EVAL_ONLY=1 is warned about, the default EXPERIMENT names LoRA and THINKING, a resume that
``python -m verl_gigpo.main`` refuses is one error line, bad values (EVAL_TASKS and EVAL_SPLIT among them) stop the
recipe before the data-prep line is printed, EVAL_OUT is numbered or refused, ALFWORLD_DATA's messages, task files
are prepared again when their settings change, a launch that joins a Ray cluster (RAY_ADDRESS) leaves the GPU count
to the cluster, and docs/gpu.md lists every variable the recipes read.

Each test runs the real ``bash recipes/run_<env>.sh``. Runs that are not dry runs see 8 GPUs through a stand-in
``nvidia-smi`` and run a stand-in Python (``PYTHON``): its one-line checks (``-c``) run in this interpreter, and a
module run (``-m``: data prep, ``verl_gigpo.main``) is reported and exits 97 instead, so a test sees how far the
recipe got and nothing launches. With the ``prep_machine`` fixture data prep really runs (in this interpreter), and
only the launch is stood in for.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from verl_gigpo import STEP_CREDIT_ESTIMATORS
from verl_gigpo.advantage.outcome import OUTCOME_ESTIMATORS

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ["alfworld", "webshop", "sokoban", "search"]
NVIDIA_SMI_8 = "".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-0000000{i})\n" for i in range(8))
#: the exit status and line of the stand-in Python when a recipe gets as far as running a module
MODULE_RUN, MODULE_RUN_LINE = 97, "stand-in python: would run -m "
#: variables the recipes read that are not theirs to document: the shell's and other tools' (Python environments,
#: CUDA, Hugging Face), ROLLOUT_NAME, which the driver sets from DEVICE, and ALFWORLD_KWARGS, its own
NOT_RECIPE_SETTINGS = {
    "CONDA_PREFIX",
    "VIRTUAL_ENV",
    "CUDA_VISIBLE_DEVICES",
    "HF_HUB_OFFLINE",
    "HOME",
    "ROLLOUT_NAME",
    "ALFWORLD_KWARGS",
}


def recipe_variables() -> set[str]:
    """Every variable the recipes read: with a default or a test in recipes/*.sh (``${NAME:-...}``, ``${NAME:+...}``,
    ``${NAME+...}``) and every upper-case name quoted in the driver and its table (recipes/driver.py,
    recipes/recipe_defaults.py), less :data:`NOT_RECIPE_SETTINGS` and the driver's own GIGPO_* inputs."""
    shell = "".join(path.read_text() for path in sorted((ROOT / "recipes").glob("*.sh")))
    python = "".join((ROOT / "recipes" / name).read_text() for name in ("driver.py", "recipe_defaults.py"))
    names = set(re.findall(r"\$\{([A-Z][A-Z0-9_]*):?[-+]", shell))
    names |= set(re.findall(r"[\"'](?:[a-z]+:)?([A-Z][A-Z0-9_]+)[\"']", python))
    return {name for name in names if not name.startswith("GIGPO_")} - NOT_RECIPE_SETTINGS


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


def stand_in_python(path: Path, *real_modules: str) -> Path:
    """Write the stand-in Python (module docstring) to ``path``: ``-c`` and ``-m`` of ``real_modules`` run in this
    interpreter; any other ``-m`` prints :data:`MODULE_RUN_LINE` and the rest of its command line and exits
    :data:`MODULE_RUN`."""
    real = "".join(
        f'if [ "$1" = "-m" ] && [ "$2" = "{module}" ]; then exec {shlex.quote(sys.executable)} "$@"; fi\n'
        for module in real_modules
    )
    path.write_text(
        f'#!/bin/sh\nif [ "$1" = "-c" ]; then exec {shlex.quote(sys.executable)} "$@"; fi\n{real}'
        f'echo "stand-in python: would run $*" >&2\nexit {MODULE_RUN}\n'
    )
    path.chmod(0o755)
    return path


@pytest.fixture
def machine(tmp_path) -> dict[str, str]:
    """The environment of a run that is not a dry run, on a stand-in 8-GPU machine with the stand-in Python (module
    docstring), a local model folder and an ALFWorld data folder (empty ``json_2.1.1/``)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\ncat <<'EOF'\n{NVIDIA_SMI_8}EOF\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    python = stand_in_python(bin_dir / "python")
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


@pytest.fixture
def prep_machine(machine, tmp_path) -> dict[str, str]:
    """:func:`machine` whose stand-in Python runs data prep (``-m verl_gigpo.data.prepare``) for real."""
    python = stand_in_python(tmp_path / "bin" / "python-prep", "verl_gigpo.data.prepare")
    return {**machine, "PYTHON": str(python)}


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


# ---------------------------------------------------------------------------------------- 1. a finished experiment
@pytest.mark.parametrize("recipe", RECIPES)
def test_a_finished_experiment_stops_before_anything_runs(recipe, machine, tmp_path):
    """All TOTAL_ITERS done: one error line with the steps, the checkpoint and what to do; no data prep, no launch."""
    folder = checkpointed(tmp_path / "exp", 2, 3)
    proc = run(recipe, f"trainer.default_local_dir={folder}", TOTAL_ITERS="3", EXPERIMENT="exp", **machine)
    assert proc.returncode == 1, proc.stderr
    error = proc.stderr.splitlines()[-1]
    assert error.startswith("error: experiment exp has already finished 3/3 steps (TOTAL_ITERS=3)"), error
    ckpt = folder / "global_step_3"
    assert f"its checkpoint: {ckpt}." in error
    assert "raise TOTAL_ITERS" in error and "set a new EXPERIMENT" not in error  # the folder was given by override
    assert f"pass another trainer.default_local_dir (or delete {folder})" in error
    # the evaluation: the variables the user set that it needs (the model, the Python, the experiment, ALFWorld's data)
    given = f"PYTHON={machine['PYTHON']} MODEL_PATH={machine['MODEL_PATH']} EXPERIMENT=exp"
    if recipe == "alfworld":
        given += f" ALFWORLD_DATA={machine['ALFWORLD_DATA']}"
    assert error.endswith(f"to evaluate it: EVAL_ONLY=1 CKPT={ckpt} {given} bash {ROOT}/recipes/run_{recipe}.sh")
    assert "start Ray and vLLM" in error
    assert MODULE_RUN_LINE not in proc.stderr and proc.stdout == ""


def test_the_finished_message_on_device_cpu_names_its_rollout_and_repeats_device(tmp_path):
    """DEVICE=cpu runs the hf rollout servers, not vLLM; the evaluation it suggests runs on the CPU too, with the
    LoRA rank and THINKING of the run (shell-quoted values), and without variables the user left unset."""
    folder = checkpointed(tmp_path / "exp", 2)
    env = {"DRY_RUN": "1", "DEVICE": "cpu", "TOTAL_ITERS": "2", "DATA_DIR": str(tmp_path), "LORA_RANK": "8"}
    proc = run("sokoban", f"trainer.default_local_dir={folder}", THINKING="0", MODEL_PATH="/my models/tiny", **env)
    note = next(line for line in proc.stderr.splitlines() if line.startswith("note: DRY_RUN=1"))
    assert "A launch would start Ray and the hf rollout servers, load it" in note and "vLLM" not in note
    command = note.split("to evaluate it: ", 1)[1]
    assert shlex.split(command)[:-2] == [
        "EVAL_ONLY=1",
        f"CKPT={folder / 'global_step_2'}",
        "DEVICE=cpu",
        "MODEL_PATH=/my models/tiny",
        "LORA_RANK=8",
        "THINKING=0",
    ]
    proc = run("sokoban", f"trainer.default_local_dir={folder}", "actor_rollout_ref.rollout.name=sglang", **env)
    assert "A launch would start Ray and SGLang, load it" in proc.stderr


def test_a_launch_that_has_steps_left_goes_on(machine, tmp_path):
    """The same folder with TOTAL_ITERS raised: the recipe goes on to data prep (the stand-in's module run)."""
    folder = checkpointed(tmp_path / "exp", 3)
    proc = run("sokoban", f"trainer.default_local_dir={folder}", TOTAL_ITERS="4", **machine)
    assert proc.returncode == MODULE_RUN, proc.stderr
    assert f"{MODULE_RUN_LINE}verl_gigpo.data.prepare" in proc.stderr and "already" not in proc.stderr


@pytest.mark.parametrize(
    ("steps", "pointer", "args", "env", "expected"),
    [
        # the step verl resumes from (its pointer) against trainer.total_training_steps
        ([3], None, [], {"TOTAL_ITERS": "3"}, "finished 3/3 steps (TOTAL_ITERS=3)"),
        ([5], None, [], {"TOTAL_ITERS": "3"}, "trained 5 steps, more than the 3 this launch asks for (TOTAL_ITERS=3)"),
        ([3], " 3 \n", [], {"TOTAL_ITERS": "3"}, "finished 3/3 steps"),  # verl's int() allows the white space
        ([3], None, [], {"TOTAL_ITERS": "4"}, None),
        # an override of trainer.total_training_steps wins over TOTAL_ITERS, in the check as in the command
        ([3], None, ["trainer.total_training_steps=4"], {"TOTAL_ITERS": "3"}, None),
        (
            [3],
            None,
            ["trainer.total_training_steps=3"],
            {"TOTAL_ITERS": "9"},
            "finished 3/3 steps (trainer.total_training_steps=3)",
        ),
        # what verl does not resume from: no pointer (an unfinished save), a pointer to a missing folder
        ([3], "absent", [], {"TOTAL_ITERS": "3"}, None),
        ([2], "3", [], {"TOTAL_ITERS": "3"}, None),
        ([], "3", [], {"TOTAL_ITERS": "3"}, None),
        # launches that do not resume this folder, or do not train
        ([3], None, ["trainer.resume_mode=disable"], {"TOTAL_ITERS": "3"}, None),
        ([3], None, ["trainer.val_only=true"], {"TOTAL_ITERS": "3"}, None),
        ([3], None, [], {"TOTAL_ITERS": "3", "EVAL_ONLY": "1"}, None),
        # what only Hydra or verl can resolve: left to verl_gigpo.main
        ([3], None, ["trainer.total_training_steps=null"], {"TOTAL_ITERS": "3"}, None),
    ],
)
def test_when_a_launch_counts_as_finished(steps, pointer, args, env, expected, tmp_path):
    """Dry runs: the note (a real launch would stop) appears exactly when verl would resume a step >= the steps to
    train; the command is printed either way (exit 0)."""
    folder = checkpointed(tmp_path / "exp", *steps, pointer=pointer)
    proc = run("sokoban", f"trainer.default_local_dir={folder}", *args, DRY_RUN="1", DATA_DIR=str(tmp_path), **env)
    assert proc.returncode == 0, proc.stderr
    notes = [line for line in proc.stderr.splitlines() if line.startswith("note: DRY_RUN=1")]
    if expected is None:
        assert notes == []
    else:
        assert len(notes) == 1 and expected in notes[0], proc.stderr
    assert " -m verl_gigpo.main" in proc.stdout or " -m verl_gigpo.evaluate" in proc.stdout  # EVAL_ONLY=1


@pytest.mark.parametrize(
    ("steps", "pointer"),
    [([2, 3], "3"), ([3], " 3 \n"), ([3], "absent"), ([2], "3"), ([], "3"), ([3], "three"), ([3], ""), ([], "absent")],
)
def test_the_recipes_read_a_checkpoint_folder_as_verl_gigpo_main_does(steps, pointer, tmp_path, monkeypatch):
    """The driver's reader (standard library only, for dry runs with any Python) gives the step that
    python -m verl_gigpo.main's launch preparation finds verl resuming from."""
    import runpy

    from verl_gigpo.verl_glue.launch import read_checkpoint_folder

    folder = tmp_path / "exp"
    folder.mkdir()
    for step in steps:
        (folder / f"global_step_{step}").mkdir()
    if pointer != "absent":
        (folder / "latest_checkpointed_iteration.txt").write_text(pointer)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the driver puts recipes/ first to find its table
    resumed_step = runpy.run_path(str(ROOT / "recipes" / "driver.py"))["resumed_step"]
    assert (
        resumed_step(str(folder))
        == read_checkpoint_folder(folder).latest
        == (3 if pointer.strip() == "3" and 3 in steps else 0)
    )


def test_the_finished_check_reads_the_folder_verl_resumes_from(tmp_path):
    """Without an override the folder is verl's trainer.default_local_dir of the printed command (composed by Hydra),
    relative to the repository root; trainer.project_name and trainer.experiment_name overrides move it with it."""
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "recipes", repo / "recipes")
    env = {"DRY_RUN": "1", "PYTHON": sys.executable, "DATA_DIR": str(tmp_path), "TOTAL_ITERS": "3"}
    for args, experiment in [((), "exp1"), (("trainer.project_name=p2", "trainer.experiment_name=exp2"), "exp2")]:
        proc = run("webshop", *args, root=repo, EXPERIMENT="exp1", **env)
        with initialize_config_dir(config_dir=str(ROOT / "verl_gigpo" / "config"), version_base=None):
            cfg = compose(config_name="gigpo_trainer", overrides=printed_overrides(proc))
        folder = repo / cfg.trainer.default_local_dir  # verl: relative to the current directory, the repository
        assert "already" not in proc.stderr
        checkpointed(folder, 3)
        proc = run("webshop", *args, root=repo, EXPERIMENT="exp1", **env)
        note = next(line for line in proc.stderr.splitlines() if line.startswith("note: DRY_RUN=1"))
        assert f"experiment {experiment} has already finished 3/3 steps" in note
        assert f"its checkpoint: {folder / 'global_step_3'}." in note
        assert ("set a new EXPERIMENT" in note) == (not args)


# ------------------------------------------------------------------------------------------------ 2. ADV_ESTIMATOR
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


# ------------------------------------------------------------------------------------- 3. CKPT without EVAL_ONLY=1
def test_ckpt_without_eval_only_is_warned_about_and_changes_nothing(tmp_path):
    env = {"DRY_RUN": "1", "DATA_DIR": str(tmp_path), "EXPERIMENT": "exp"}
    plain = run("search", **env)
    proc = run("search", CKPT="/runs/x/global_step_5", **env)
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning: CKPT=")]
    assert len(warnings) == 1, proc.stderr
    assert "CKPT=/runs/x/global_step_5 is ignored: CKPT is read only with EVAL_ONLY=1" in warnings[0]
    assert f"{ROOT / 'checkpoints' / 'verl_gigpo' / 'exp'}" in warnings[0]  # where it resumes from instead
    assert "trainer.resume_from_path=" in warnings[0]
    assert proc.stdout == plain.stdout  # the training command, unchanged
    evaluation = run("search", CKPT="/runs/x/global_step_5", EVAL_ONLY="1", **env)
    assert evaluation.returncode == 0 and "warning: CKPT=" not in evaluation.stderr


# ----------------------------------------------------------------------------------------------------- 4. messages
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
        ({"NNODES": "0"}, "NNODES=0 is not a whole number >= 1; it is the number of Ray nodes"),
        ({"NNODES": "two", "RAY_ADDRESS": "head:6379"}, "NNODES=two is not a whole number >= 1"),
        ({"NNODES": "2"}, "NNODES=2 trains on 2 Ray nodes, but RAY_ADDRESS is not set"),
        ({"PROMPT_TEMPLATE": "/nowhere/t.txt"}, "PROMPT_TEMPLATE=/nowhere/t.txt is not a file"),
    ],
)
@pytest.mark.parametrize("recipe", ["alfworld", "search"])
def test_a_bad_value_stops_a_dry_run_before_the_data_prep_line(recipe, env, message):
    """The error is the last line of stderr and nothing was printed on stdout (the data-prep line comes later)."""
    proc = run(recipe, DRY_RUN="1", **env)
    assert proc.returncode == 1 and proc.stdout == ""
    assert message in proc.stderr.splitlines()[-1]


@pytest.mark.parametrize("value", ["-1", "abc", "0", "2.5", "all"])
def test_eval_tasks_is_a_whole_number_checked_before_anything_is_printed(value):
    proc = run("sokoban", DRY_RUN="1", EVAL_ONLY="1", EVAL_TASKS=value)
    assert proc.returncode == 1 and proc.stdout == ""
    assert f"EVAL_TASKS={value} is not a whole number >= 1" in proc.stderr.splitlines()[-1]


@pytest.mark.parametrize(
    ("recipe", "value", "allowed"),
    [
        ("alfworld", "valid_unsen", "use valid_seen or valid_unseen"),
        ("alfworld", "train", "use valid_seen or valid_unseen (train holds the training tasks)"),
        ("sokoban", "dev", "use test"),
        ("webshop", "valid", "use test"),
    ],
)
def test_eval_split_is_one_of_the_environments_evaluation_splits(recipe, value, allowed, tmp_path):
    """The splits come from the environment's class (environments.env_class(name).splits, less train)."""
    env = {"DRY_RUN": "1", "EVAL_ONLY": "1", "PYTHON": sys.executable, "DATA_DIR": str(tmp_path)}
    proc = run(recipe, EVAL_SPLIT=value, **env)
    assert proc.returncode == 1 and proc.stdout == ""
    assert f"EVAL_SPLIT={value} is not an evaluation split of {recipe}; {allowed}" in proc.stderr.splitlines()[-1]
    good = {"alfworld": "valid_unseen"}.get(recipe, "test")
    proc = run(recipe, EVAL_SPLIT=good, **env)
    assert proc.returncode == 0 and f"{tmp_path}/eval-{good}-" in proc.stdout


def printed_eval_out(proc: subprocess.CompletedProcess) -> str:
    """The --out of the evaluation command a dry run printed."""
    assert proc.returncode == 0, proc.stderr
    command = "\n".join(line for line in proc.stdout.splitlines() if not line.startswith("#"))
    argv = shlex.split(command.replace("\\\n", " "))
    assert argv[1:3] == ["-m", "verl_gigpo.evaluate"], argv[:3]
    return argv[argv.index("--out") + 1]


def test_a_default_eval_out_that_holds_an_evaluation_is_numbered(tmp_path):
    """runs/eval/<experiment>-<checkpoint>-<split> (from the repository root), then -2, -3 ... as long as the folder
    holds summary.json or transcripts/ (what the evaluation refuses to write into); an empty folder is used."""
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "recipes", repo / "recipes")
    env = {"DRY_RUN": "1", "EVAL_ONLY": "1", "PYTHON": sys.executable, "DATA_DIR": str(tmp_path / "data")}
    env |= {"EXPERIMENT": "exp", "CKPT": "/ckpts/exp/global_step_5"}
    base = "runs/eval/exp-global_step_5-test"
    assert printed_eval_out(run("sokoban", root=repo, **env)) == base
    (repo / base).mkdir(parents=True)
    assert printed_eval_out(run("sokoban", root=repo, **env)) == base
    (repo / base / "summary.json").write_text("{}")
    (repo / f"{base}-2" / "transcripts").mkdir(parents=True)
    proc = run("sokoban", root=repo, **env)
    assert printed_eval_out(proc) == f"{base}-3"
    assert f"{base} already holds an evaluation: this one goes to {base}-3 (EVAL_OUT sets the folder)" in proc.stderr


def test_a_given_eval_out_that_holds_an_evaluation_stops_the_recipe(machine, tmp_path):
    """Before data prep and the launch, naming EVAL_OUT; a dry run notes it and prints the command."""
    out = tmp_path / "eval"
    (out / "transcripts").mkdir(parents=True)
    proc = run("sokoban", EVAL_ONLY="1", EVAL_OUT=str(out), **machine)
    assert proc.returncode == 1 and MODULE_RUN_LINE not in proc.stderr and proc.stdout == ""
    assert proc.stderr.splitlines()[-1].startswith(f"error: EVAL_OUT={out} already holds an evaluation")
    assert "--out" not in proc.stderr
    dry = run("sokoban", EVAL_ONLY="1", EVAL_OUT=str(out), DRY_RUN="1", DATA_DIR=str(tmp_path))
    assert printed_eval_out(dry) == str(out)
    assert f"note: DRY_RUN=1 prints the command, but a launch would stop here: EVAL_OUT={out} already" in dry.stderr
    (out / "transcripts").rmdir()  # an empty folder is fine
    proc = run("sokoban", EVAL_ONLY="1", EVAL_OUT=str(out), **machine)
    assert proc.returncode == MODULE_RUN and f"{MODULE_RUN_LINE}verl_gigpo.data.prepare" in proc.stderr


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


# --------------------------------------------------------------------------------------------------- 5. EXPERIMENT
@pytest.mark.parametrize(
    ("env", "suffix"),
    [
        ({}, ""),
        ({"LORA_RANK": "0"}, ""),
        ({"LORA_RANK": "64"}, "_lora64"),
        ({"LORA_RANK": "064"}, "_lora64"),  # the rank as verl gets it
        ({"THINKING": "0"}, "_think0"),
        ({"THINKING": "1", "LORA_RANK": "8"}, "_lora8_think1"),
    ],
)
def test_the_default_experiment_names_lora_and_thinking(env, suffix, tmp_path):
    """A LoRA run and a run with THINKING set get their own experiment folder (a full run's checkpoints are not
    resumed by a LoRA launch); ADV_ESTIMATOR and the model were in the name already; EXPERIMENT wins."""
    base = {"DRY_RUN": "1", "DATA_DIR": str(tmp_path), "MODEL_PATH": "/models/Qwen3-4B"}
    for estimator in ("gigpo", "grpo"):
        args = printed_overrides(run("alfworld", ADV_ESTIMATOR=estimator, **base, **env))
        assert f"trainer.experiment_name=alfworld_{estimator}_Qwen3-4B{suffix}" in args
    assert "trainer.experiment_name=mine" in printed_overrides(run("search", EXPERIMENT="mine", **base, **env))


# ----------------------------------------------------------------------------- 6. a resume verl_gigpo.main refuses
@pytest.fixture
def launch_files(tmp_path) -> list[str]:
    """Overrides naming a model folder (config.json) and task files that exist: what preflight's path checks need."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    for split in ("train", "val"):
        (tmp_path / f"{split}.parquet").write_bytes(b"")
    return [
        f"actor_rollout_ref.model.path={tmp_path / 'model'}",
        f"data.train_files={tmp_path / 'train.parquet'}",
        f"data.val_files={tmp_path / 'val.parquet'}",
    ]


def compose_launch(overrides: list[str]):
    """verl_gigpo/config/gigpo_trainer.yaml composed with ``overrides``, as python -m verl_gigpo.main composes it."""
    with initialize_config_dir(config_dir=str(ROOT / "verl_gigpo" / "config"), version_base=None):
        return compose(config_name="gigpo_trainer", overrides=overrides)


def test_a_refused_resume_is_one_error_line_from_verl_gigpo_main(launch_files, tmp_path, monkeypatch, capsys):
    """A checkpointed run (its launch record, then checkpoint 2), relaunched with another group size: the entry point
    of ``python -m verl_gigpo.main`` (its Hydra main, given the command line) stops before Ray with one line and exit
    status 1, no traceback and no Hydra hint (what Hydra prints for an exception it reports)."""
    from verl_gigpo.main import main
    from verl_gigpo.verl_glue.launch import prepare_launch

    folder = tmp_path / "exp"
    run_args = [*launch_files, f"trainer.default_local_dir={folder}"]
    prepare_launch(compose_launch(run_args), environ={})
    checkpointed(folder, 2)
    monkeypatch.chdir(tmp_path)
    # Hydra's own settings: leave this process's logging as it is and write no outputs/ folder
    hydra_args = ["hydra/job_logging=none", "hydra/hydra_logging=none", "hydra.output_subdir=null", "hydra.run.dir=."]
    argv = ["verl_gigpo.main", *run_args, "actor_rollout_ref.rollout.n=4", *hydra_args]
    monkeypatch.setattr(sys, "argv", argv)
    handlers = list(logging.getLogger().handlers)
    with pytest.raises(SystemExit) as exit_info:
        main()
    stderr = capsys.readouterr().err
    assert logging.getLogger().handlers == handlers and sorted(p.name for p in tmp_path.iterdir()) == [
        "exp",
        "model",
        "train.parquet",
        "val.parquet",
    ]
    assert exit_info.value.code == 1, stderr[-3000:]
    [error] = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert error == stderr.splitlines()[-1]
    assert error.startswith(f"error: cannot resume {folder} from step 2: ")
    assert "actor_rollout_ref.rollout.n: 1 -> 4" in error
    assert "choose another trainer.experiment_name (EXPERIMENT=... in the recipes)" in error
    assert "Traceback" not in stderr and "HYDRA_FULL_ERROR" not in stderr


@pytest.mark.parametrize(
    ("saved", "current", "listed"),
    [
        # no adapter before: its alpha and target modules were unused; the rank's change is what counts
        ([], ["actor_rollout_ref.model.lora_alpha=64"], {}),
        (
            [],
            ["actor_rollout_ref.model.lora_rank=64", "actor_rollout_ref.model.lora_alpha=64"],
            {"actor_rollout_ref.model.lora_rank": (0, 64)},
        ),
        # an adapter before: its alpha counts
        (
            ["actor_rollout_ref.model.lora_rank=64", "actor_rollout_ref.model.lora_alpha=64"],
            ["actor_rollout_ref.model.lora_rank=64", "actor_rollout_ref.model.lora_alpha=32"],
            {"actor_rollout_ref.model.lora_alpha": (64, 32)},
        ),
        (
            ["actor_rollout_ref.model.lora_rank=64", "actor_rollout_ref.model.lora_alpha=64"],
            [],
            {"actor_rollout_ref.model.lora_rank": (64, 0), "actor_rollout_ref.model.lora_alpha": (64, 16)},
        ),
    ],
)
def test_lora_alpha_counts_as_a_change_only_when_the_run_had_an_adapter(saved, current, listed):
    """The verl resume rule on two composed configs (verl's default lora_alpha is 16): the refused changes."""
    from omegaconf import OmegaConf

    from verl_gigpo.config.resume import VERL_RESUME

    before, after = (OmegaConf.to_container(compose_launch(args), resolve=True) for args in (saved, current))
    _, refused = VERL_RESUME.check(before, after, allow=True, resuming="", source="", start_over="")
    assert refused == listed


# --------------------------------------------------------------------------------------------------- 7. task files
def val_tasks(folder: Path) -> int:
    """How many validation tasks data prep wrote into ``folder`` (its task_types.json)."""
    return json.loads((folder / "task_types.json").read_text())["val"]["tasks"]


def prep_lines(proc: subprocess.CompletedProcess) -> list[str]:
    """The lines a run printed about preparing existing task files again."""
    return [line for line in proc.stderr.splitlines() if line.endswith(": preparing them again")]


def test_task_files_are_prepared_again_when_their_settings_change(prep_machine):
    """The stamp beside the task files holds the data-prep arguments that wrote them: the same settings reuse the
    files, a changed VAL_SIZE or TRAIN_SIZE prepares them again with one line naming what changed; a dry run says
    whether data prep would run and runs nothing."""
    env = {**prep_machine, "TRAIN_SIZE": "16", "VAL_SIZE": "8"}
    data = Path(env["DATA_DIR"])
    first = run("sokoban", **env)
    assert first.returncode == MODULE_RUN and f"{MODULE_RUN_LINE}verl_gigpo.main" in first.stderr, first.stderr
    assert val_tasks(data) == 8 and prep_lines(first) == []
    stamp = (data / "prepared_with.txt").read_text().splitlines()
    assert {"--env sokoban", "--train-size 16", "--val-size 8", "--val-split test"} == set(stamp[1:])
    again = run("sokoban", **env)
    assert f"using task files in {data} " in again.stderr and "train:" not in again.stdout and prep_lines(again) == []
    dry = run("sokoban", DRY_RUN="1", **{**env, "VAL_SIZE": "3"})
    assert dry.returncode == 0 and "# data prep (runs: " in dry.stdout and "VAL_SIZE: --val-size 8 -> 3" in dry.stdout
    assert val_tasks(data) == 8  # the dry run ran nothing
    changed = run("sokoban", **{**env, "VAL_SIZE": "3"})
    assert prep_lines(changed) == [
        f"the task files in {data} were prepared with other settings (VAL_SIZE: --val-size 8 -> 3): preparing them "
        "again"
    ]
    assert changed.returncode == MODULE_RUN and val_tasks(data) == 3
    assert "# data prep (skipped: " in run("sokoban", DRY_RUN="1", **{**env, "VAL_SIZE": "3"}).stdout
    [line] = prep_lines(run("sokoban", **{**env, "VAL_SIZE": "3", "TRAIN_SIZE": "12", "VAL_SPLIT": "train"}))
    assert "TRAIN_SIZE: --train-size 16 -> 12; VAL_SPLIT: --val-split test -> train" in line


def test_task_files_without_a_stamp_or_after_a_failed_prep_are_prepared_again(prep_machine):
    """Files an older recipe (or a hand) left have no stamp: their settings are unknown, so they are written again.
    A data prep that fails leaves no stamp either (the old one is removed before it runs)."""
    from verl_gigpo.data.prepare import write_task_files

    data = Path(prep_machine["DATA_DIR"])
    write_task_files("sokoban", data, train_size=4, val_size=2)
    env = {**prep_machine, "TRAIN_SIZE": "16", "VAL_SIZE": "8"}
    proc = run("sokoban", **env)
    assert prep_lines(proc) == [
        f"the task files in {data} have no prepared_with.txt (prepared by an older recipe or by hand, or by a data "
        "prep that did not finish), so the settings they hold are unknown: preparing them again"
    ]
    assert proc.returncode == MODULE_RUN and val_tasks(data) == 8
    failed = run("sokoban", **{**env, "VAL_SPLIT": "train"})  # data prep refuses the training split for validation
    assert failed.returncode == 2 and "VAL_SPLIT: --val-split test -> train" in failed.stderr
    assert MODULE_RUN_LINE not in failed.stderr and not (data / "prepared_with.txt").exists()
    assert "have no prepared_with.txt" in prep_lines(run("sokoban", **env))[0]


def test_alfworld_task_files_follow_alfworld_data_in_training_and_evaluation(prep_machine, alfworld_data, tmp_path):
    """The same games in another folder are another ALFWORLD_DATA: the training task files and EVAL_ONLY's own task
    folder (DATA_DIR/eval-<split>-<tasks>) are prepared again for it."""
    copy = tmp_path / "games-copy"
    shutil.copytree(alfworld_data, copy)
    env = {**prep_machine, "ALFWORLD_DATA": str(alfworld_data), "TRAIN_SIZE": "6"}
    data = Path(env["DATA_DIR"])
    for mode, folder, launch in (({}, data, "main"), ({"EVAL_ONLY": "1"}, data / "eval-valid_seen-all", "evaluate")):
        first = run("alfworld", **env, **mode)
        assert first.returncode == MODULE_RUN and f"{MODULE_RUN_LINE}verl_gigpo.{launch}" in first.stderr
        assert (folder / "prepared_with.txt").is_file() and prep_lines(first) == []
        moved = run("alfworld", **{**env, "ALFWORLD_DATA": str(copy)}, **mode)
        [line] = prep_lines(moved)
        assert line.startswith(f"the task files in {folder} were prepared with other settings (ALFWORLD_DATA: ")
        assert f'--env-kwargs {{"data_path": "{alfworld_data}"}} -> {{"data_path": "{copy}"}})' in line
        assert moved.returncode == MODULE_RUN


# --------------------------------------------------------------------------------------------------- 8. multi-node
@pytest.mark.parametrize("recipe", RECIPES)
def test_joining_a_cluster_leaves_the_gpu_count_to_the_cluster(recipe, machine):
    """Without RAY_ADDRESS the recipe stops when this machine shows fewer GPUs than N_GPUS; with it, this machine (the
    driver) need not hold the GPUs: the recipe goes on to data prep (its first module run). The cluster check is
    python -m verl_gigpo.main's (tests/test_cluster.py); the command is checked in tests/test_verl_config.py."""
    local = run(recipe, N_GPUS="16", **machine)
    assert local.returncode == 1 and "N_GPUS=16 but 8 GPU(s) are visible" in local.stderr.splitlines()[-1]
    joined = run(recipe, N_GPUS="16", NNODES="2", RAY_ADDRESS="10.0.0.1:6379", **machine)
    assert joined.returncode == MODULE_RUN, joined.stderr
    assert joined.stderr.splitlines()[-1].startswith(f"{MODULE_RUN_LINE}verl_gigpo.data.prepare --env {recipe} ")


# ----------------------------------------------------------------------------------------------------- 9. the docs
def test_docs_gpu_lists_every_variable_the_recipes_read():
    """docs/gpu.md's "Variables" section names each variable of recipes/*.sh (found by recipe_variables)."""
    page = (ROOT / "docs" / "gpu.md").read_text()
    section = page.split("### Variables\n", 1)[1].split("\n### ", 1)[0]
    documented = set(re.findall(r"`([A-Z][A-Z0-9_]*)`", section))
    assert {"KL_COEF", "EVAL_ONLY", "TOTAL_ITERS"} <= recipe_variables()  # the scan finds the recipes' variables
    missing = sorted(recipe_variables() - documented)
    assert not missing, f"docs/gpu.md, Variables: {missing} not listed"
