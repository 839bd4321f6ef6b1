"""CPU tests of what a GPU install needs: requirements-gpu.txt brings flash-attn through verl 0.9.1's own ``fsdp``
extra (read from verl's installed metadata), and the recipes choose the attention backend of the FSDP workers:
flash_attention_2 when ``flash_attn`` imports, else sdpa with one warning line (``recipes/common.sh``,
``gigpo_attention_setup``).

A stand-in ``flash_attn`` package on PYTHONPATH makes the import work (or fail) for the recipe's probe, whatever
this machine has installed.
"""

from __future__ import annotations

import importlib.metadata
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
ATTN_KEY = "actor_rollout_ref.model.override_config.attn_implementation"


def gpu_requirements() -> dict[str, Requirement]:
    """The requirements of requirements-gpu.txt by (normalised) name."""
    reqs = {}
    for line in (ROOT / "requirements-gpu.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            reqs[req.name.lower()] = req
    return reqs


def verl_extra_requirements(extras: set[str]) -> dict[str, Requirement]:
    """What installing ``verl[extras]`` pulls in, extras of extras included, from verl's installed metadata."""
    requires = [Requirement(r) for r in importlib.metadata.requires("verl") or []]
    todo, done, pulled = set(extras), set(), {}
    while todo:
        extra = todo.pop()
        done.add(extra)
        for req in requires:
            if req.marker is None or not req.marker.evaluate({"extra": extra}):
                continue
            if req.name == "verl":
                todo |= set(req.extras) - done
            else:
                pulled[req.name.lower()] = req
    return pulled


def test_gpu_requirements_bring_verls_fsdp_extra_with_flash_attn():
    assert importlib.metadata.version("verl") == "0.9.1"
    reqs = gpu_requirements()
    verl = reqs["verl"]
    assert str(verl.specifier) == "==0.9.1" and {"vllm", "fsdp"} <= verl.extras
    pulled = verl_extra_requirements(set(verl.extras))
    # the FSDP workers' model config defaults to flash_attention_2: the fsdp extra must bring the package
    assert str(pulled["flash-attn"].specifier) == "==2.8.3"
    assert {"liger-kernel", "trl", "cupy-cuda13x", "vllm", "transformers"} <= set(pulled)
    # the pins this file repeats are verl's own
    for name in ("vllm", "torch"):
        assert reqs[name].specifier == pulled[name].specifier, name


def dry_run(recipe: str, flash_attn: str | None, tmp_path: Path, **env: str) -> tuple[list[str], str]:
    """``DRY_RUN=1 bash recipes/run_<recipe>.sh`` with a stand-in flash_attn package (``"ok"``: imports; ``"broken"``:
    raises ImportError; None: none added). Returns (the command's Hydra overrides, stderr)."""
    pythonpath = os.environ.get("PYTHONPATH", "")
    if flash_attn is not None:
        package = tmp_path / flash_attn / "flash_attn"
        package.mkdir(parents=True)
        body = "__version__ = '2.8.3'\n" if flash_attn == "ok" else "raise ImportError('built for another torch')\n"
        (package / "__init__.py").write_text(body)
        pythonpath = os.pathsep.join(p for p in (str(package.parent), pythonpath) if p)
    base = {k: v for k, v in os.environ.items() if k not in ("DEVICE", "ATTN_IMPLEMENTATION", "N_GPUS")}
    proc = subprocess.run(
        ["bash", str(ROOT / "recipes" / f"run_{recipe}.sh")],
        env={**base, "DRY_RUN": "1", "PYTHONPATH": pythonpath, "PYTHON": sys.executable, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    command = "\n".join(line for line in proc.stdout.splitlines() if not line.startswith("#"))
    return shlex.split(command.replace("\\\n", " "))[3:], proc.stderr


def compose_gigpo(overrides: list[str]):
    with initialize_config_dir(config_dir=str(ROOT / "verl_gigpo" / "config"), version_base=None):
        return compose(config_name="gigpo_trainer", overrides=overrides)


def test_flash_attention_when_flash_attn_imports(tmp_path):
    overrides, stderr = dry_run("alfworld", "ok", tmp_path)
    cfg = compose_gigpo(overrides)
    assert cfg.actor_rollout_ref.model.override_config.attn_implementation == "flash_attention_2"
    assert cfg.actor_rollout_ref.model.use_remove_padding is True
    assert "flash_attn" not in stderr


def test_sdpa_fallback_with_one_warning_when_flash_attn_does_not_import(tmp_path):
    overrides, stderr = dry_run("alfworld", "broken", tmp_path)
    cfg = compose_gigpo(overrides)
    assert cfg.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"
    assert cfg.actor_rollout_ref.model.use_remove_padding is False  # sdpa over a packed batch needs a dense mask
    warnings = [line for line in stderr.splitlines() if "flash_attn" in line]
    assert len(warnings) == 1 and warnings[0].startswith("warning: flash_attn does not import with ")
    assert "sdpa" in warnings[0] and "requirements-gpu.txt" in warnings[0]


@pytest.mark.parametrize(("value", "packing"), [("sdpa", False), ("eager", False), ("flash_attention_2", True)])
def test_explicit_attention_backend_is_used_without_probing(value, packing, tmp_path):
    overrides, stderr = dry_run("sokoban", "broken", tmp_path, ATTN_IMPLEMENTATION=value)
    assert f"++{ATTN_KEY}={value}" in overrides
    cfg = compose_gigpo(overrides)
    assert cfg.actor_rollout_ref.model.override_config.attn_implementation == value
    assert cfg.actor_rollout_ref.model.use_remove_padding is packing
    assert "flash_attn" not in stderr  # no probe, no warning


def test_unknown_attention_backend_is_rejected():
    env = {**os.environ, "DRY_RUN": "1", "ATTN_IMPLEMENTATION": "flash3"}
    proc = subprocess.run(
        ["bash", str(ROOT / "recipes" / "run_webshop.sh")], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 1
    assert "ATTN_IMPLEMENTATION=flash3: use auto, flash_attention_2, sdpa or eager" in proc.stderr


def test_cpu_recipes_leave_attention_to_the_cpu_platform(tmp_path):
    overrides, stderr = dry_run("search", "ok", tmp_path, DEVICE="cpu")
    assert not any(ATTN_KEY in o for o in overrides) and "flash_attn" not in stderr
    cfg = compose_gigpo(overrides)
    assert cfg.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"  # platform/cpu.yaml


def test_mini_batch_rounding_above_mini_batch_rows_is_warned(tmp_path):
    """16 GPUs x micro-batches of 8 make 128-row update steps: WebShop's 64 rows per optimizer step would double."""
    _, stderr = dry_run("webshop", "ok", tmp_path, N_GPUS="16")
    assert "warning: MINI_BATCH_ROWS=64 is below the rows one update step needs on 16 GPU(s) (128 = N_GPUS x" in stderr
    _, stderr = dry_run("webshop", "ok", tmp_path / "8", N_GPUS="8")
    assert "MINI_BATCH_ROWS" not in stderr
