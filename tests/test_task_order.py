"""How a run draws its tasks on verl's path (docs/runs.md, "Which tasks a run plays"), checked on the recipes' own
config: ``DRY_RUN=1 bash recipes/run_sokoban.sh`` prints the command, Hydra composes its overrides over verl's config,
and verl's own trainer code builds the task loaders (``PPOTrainer._init_tokenizer``, ``_init_dataloader``: verl's
``create_rl_dataset``, ``create_rl_sampler`` and ``StatefulDataLoader``) and draws the first iteration's tasks
(``_fetch_one_gen_batch``), on the ``gigpo_sync`` trainer mode's own object.

Two launches are two fresh processes: each runs this file as a script (``python tests/test_task_order.py DIR
OVERRIDES...``) and prints the task seeds it drew.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TRAIN_SIZE, VAL_SIZE = 256, 8

pytestmark = pytest.mark.slow  # two fresh Python processes that import verl (~10-30 s each on 2 shared cores)


def recipe_overrides(data_dir: Path, model_dir: Path, **env: str) -> list[str]:
    """The Hydra overrides of ``DRY_RUN=1 bash recipes/run_sokoban.sh`` with ``env`` (task files in ``data_dir``)."""
    base = {k: v for k, v in os.environ.items() if k not in ("N_GPUS", "CUDA_VISIBLE_DEVICES", "DEVICE", "SEED")}
    base["OBSERVATION"] = "text"  # the text Sokoban, for the tiny text model
    proc = subprocess.run(
        ["bash", str(ROOT / "recipes" / "run_sokoban.sh")],
        env={**base, "DRY_RUN": "1", "DATA_DIR": str(data_dir), "MODEL_PATH": str(model_dir), **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    command = "\n".join(line for line in proc.stdout.splitlines() if not line.startswith("#"))
    argv = shlex.split(command.replace("\\\n", " "))
    assert argv[1:3] == ["-m", "verl_gigpo.main"], argv[:3]
    return argv[3:]


def draw_tasks(overrides: list[str]) -> dict[str, list[int]]:
    """Compose the config and draw, with verl's own trainer code, the first iteration's training tasks and the
    validation tasks. Returns ``{"train": task seeds, "val": task seeds}`` (the ``seed`` column of the rows)."""
    from hydra import compose, initialize_config_dir

    from verl_gigpo.verl_glue.trainer import GiGPOTrainerSync

    with initialize_config_dir(config_dir=str(ROOT / "verl_gigpo" / "config"), version_base=None):
        cfg = compose(config_name="gigpo_trainer", overrides=[*overrides, "data.dataloader_num_workers=0"])
    trainer = GiGPOTrainerSync(cfg)
    trainer._init_tokenizer()
    trainer._init_dataloader()
    first = trainer._fetch_one_gen_batch()  # what the first iteration sends to the agent loop
    val = next(iter(trainer.val_dataloader))  # verl validates on the whole list in one batch
    return {"train": [int(s) for s in first["seed"]], "val": [int(s) for s in val["seed"]]}


def launch(overrides: list[str]) -> dict[str, list[int]]:
    """:func:`draw_tasks` in a fresh Python process (a new launch: no state shared with this one)."""
    proc = subprocess.run(
        [sys.executable, __file__, *overrides],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def task_files(tmp_path_factory) -> Path:
    from verl_gigpo.data.prepare import write_task_files

    out = tmp_path_factory.mktemp("sokoban-tasks")
    write_task_files("sokoban", out, train_size=TRAIN_SIZE, val_size=VAL_SIZE)
    return out


def test_two_launches_draw_the_same_first_iteration_and_another_seed_another(task_files, tiny_model_dir):
    """The recipe's data.seed (SEED, default 0) fixes the permutation: two fresh launches draw the same first
    iteration's tasks; SEED=1 draws others. Validation is the task list in file order, whatever the seed."""
    overrides = recipe_overrides(task_files, tiny_model_dir)
    assert "data.seed=0" in overrides
    first, second = launch(overrides), launch(overrides)
    batch = 32  # the sokoban recipe's tasks per iteration
    assert first == second
    assert len(first["train"]) == batch == len(set(first["train"]))
    assert first["train"] != list(range(batch))  # shuffled, not the file order
    other = draw_tasks(recipe_overrides(task_files, tiny_model_dir, SEED="1"))  # in this process
    assert other["train"] != first["train"] and set(other["train"]) <= set(range(TRAIN_SIZE))
    assert first["val"] == other["val"] == list(range(VAL_SIZE))


if __name__ == "__main__":  # one launch: draw the tasks for the overrides given and print them as JSON
    print(json.dumps(draw_tasks(sys.argv[1:])))
