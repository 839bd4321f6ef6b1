"""Compose a GPU recipe's command as it would run (tests): ``DRY_RUN=1 bash recipes/run_<recipe>.sh`` prints it, and
Hydra composes the printed overrides over verl's own config (as ``python -m verl_gigpo.main`` does before Ray
starts)."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir

ROOT = Path(__file__).resolve().parents[2]


def compose_recipe(recipe: str, *args: str, **env: str) -> tuple[Any, list[str]]:
    """(composed config, data-prep argv) of ``DRY_RUN=1 bash recipes/run_<recipe>.sh args`` with extra env vars
    (``N_GPUS``, ``CUDA_VISIBLE_DEVICES``, ``DEVICE`` and ``SEED`` of the caller's environment left out)."""
    base = {k: v for k, v in os.environ.items() if k not in ("N_GPUS", "CUDA_VISIBLE_DEVICES", "DEVICE", "SEED")}
    proc = subprocess.run(
        ["bash", str(ROOT / "recipes" / f"run_{recipe}.sh"), *args],
        env={**base, "DRY_RUN": "1", **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    prep = [shlex.split(line[2:]) for line in lines if line.startswith("# ") and "verl_gigpo.data.prepare" in line]
    assert len(prep) == 1, proc.stdout
    argv = shlex.split("\n".join(line for line in lines if not line.startswith("#")).replace("\\\n", " "))
    assert argv[1:3] == ["-m", "verl_gigpo.main"], argv[:3]
    with initialize_config_dir(config_dir=str(ROOT / "verl_gigpo" / "config"), version_base=None):
        return compose(config_name="gigpo_trainer", overrides=argv[3:]), prep[0]
