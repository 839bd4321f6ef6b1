"""CPU tests of what a GPU install needs.

* requirements-gpu.txt: verl 0.9.1's ``vllm`` extra and its ``fsdp`` extra's packages without flash-attn (read from
  verl's installed metadata), and -- against the package index, ``slow`` -- a resolution of the whole GPU install in
  which everything is a wheel (nothing to compile), flash-attn is absent and the pins hold;
* the recipes choose the attention backend of the FSDP workers: flash_attention_2 when ``flash_attn`` imports, else
  sdpa with one warning line (``recipes/common.sh``, ``gigpo_attention_setup``). A stand-in ``flash_attn`` package on
  PYTHONPATH makes the import work (or fail) for the recipe's probe, whatever this machine has installed;
* tests/gpu/check_gpu.sh says what is missing without a GPU and prints its summary when the recipe fails.
"""

from __future__ import annotations

import importlib.metadata
import os
import shlex
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
ATTN_KEY = "actor_rollout_ref.model.override_config.attn_implementation"
#: source packages the GPU install may build: pure Python, no compiler. hydra-core 1.3 (verl's config system) pins
#: antlr4-python3-runtime==4.9.*, of which PyPI has sdists only (its setup.py lists packages, no extension).
PURE_PYTHON_SDISTS = {"antlr4-python3-runtime"}
#: the GPU machine's platform: Linux x86_64 with glibc 2.31 or newer (vLLM 0.24.0 needs llguidance 1.7, whose
#: x86_64 wheels are manylinux_2_31), and Python 3.11 (any of 3.10-3.12, verl's range)
GPU_PLATFORM, GPU_PYTHON = "x86_64-manylinux_2_31", "3.11"


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


def test_gpu_requirements_bring_the_fsdp_extra_without_flash_attn():
    """requirements-gpu.txt asks for no flash-attn, directly or through any verl extra (verl's ``fsdp`` extra brings
    it as a source package: a failed CUDA build of it aborted the whole install), and carries every other package of
    the ``fsdp`` extra with verl's own pin."""
    assert importlib.metadata.version("verl") == "0.9.1"
    reqs = gpu_requirements()
    verl = reqs["verl"]
    assert str(verl.specifier) == "==0.9.1" and verl.extras == {"vllm", "cupy-cu130"}
    pulled = verl_extra_requirements(set(verl.extras))
    assert "flash-attn" not in reqs and "flash-attn" not in pulled
    # verl's own fsdp extra does bring it: the reason for leaving that extra out
    fsdp = verl_extra_requirements({"fsdp"})
    assert str(fsdp.pop("flash-attn").specifier) == "==2.8.3"
    for name, req in fsdp.items():
        have = [r for r in (reqs.get(name), pulled.get(name)) if r is not None]
        assert have, f"{name} (verl's fsdp extra) is missing from requirements-gpu.txt"
        assert all(r.specifier == req.specifier for r in have), (name, [str(r) for r in have], str(req))
    assert {"vllm", "transformers", "cupy-cuda13x", "liger-kernel", "trl", "flash-linear-attention"} <= set(reqs) | set(
        pulled
    )
    for name in ("vllm", "torch"):  # the pins this file repeats are verl's own
        assert reqs[name].specifier == pulled[name].specifier, name


def index_unreachable_reason(url: str = "https://pypi.org/simple/") -> str | None:
    """Why the package index cannot be used from here (a sentence), or None when ``url`` answers within 10 s."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            response.read(1)
    except (urllib.error.URLError, OSError) as error:
        return f"the package index {url} is not reachable ({error})"
    return None


def resolve_gpu_install(tmp_path: Path, platform: str) -> subprocess.CompletedProcess:
    """``uv pip compile`` of the GPU install (requirements-gpu.txt and this package's requirements.txt, as ``pip
    install -r requirements-gpu.txt && pip install -e .`` installs them) for ``platform`` and Python
    :data:`GPU_PYTHON`, wheels only but the pure-Python :data:`PURE_PYTHON_SDISTS`, from PyPI, no cache."""
    uv = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    cmd = [uv, "pip", "compile", str(ROOT / "requirements-gpu.txt"), str(ROOT / "requirements.txt")]
    cmd += ["--python-version", GPU_PYTHON, "--python-platform", platform, "--index-url", "https://pypi.org/simple"]
    cmd += ["--no-cache", "--only-binary", ":all:", "--no-binary", ",".join(sorted(PURE_PYTHON_SDISTS))]
    cmd += ["--quiet", "--no-header", "--no-annotate", "-o", str(tmp_path / f"{platform}.txt")]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)


@pytest.mark.slow
def test_gpu_install_resolves_to_wheels_only(tmp_path):
    """The whole GPU install resolves for a Linux x86_64 GPU machine (glibc >= 2.31, Python 3.11) with every package
    a wheel but the pure-Python :data:`PURE_PYTHON_SDISTS`: nothing is compiled, no CUDA toolkit is needed; flash-attn
    is absent; the pins hold (torch 2.11.0 is a CUDA 13.0 build); and glibc 2.28 is too old (llguidance).

    uv resolves from the wheels' metadata alone (seconds); ``pip install --dry-run --report`` reaches the same set
    (268 packages, only antlr4 a source package) but downloads every wheel to read it where the index serves no
    separate metadata (about 3.8 GB, minutes), and ``--only-binary :all:`` makes pip fall back to hydra-core 0.11,
    which verl cannot use. ``--no-binary antlr4-python3-runtime`` is the one exception: a release without it
    would make the resolver fall back the same way, and the check would pass while the install would not.
    """
    reason = index_unreachable_reason()
    if reason:
        pytest.skip(reason)
    proc = resolve_gpu_install(tmp_path, GPU_PLATFORM)
    assert proc.returncode == 0, proc.stderr[-5000:]
    version = {}
    for line in (tmp_path / f"{GPU_PLATFORM}.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, _, value = line.split(";")[0].strip().partition("==")
            version[name.lower().replace("_", "-")] = value
    assert len(version) > 200 and "flash-attn" not in version
    pins = {"verl": "0.9.1", "torch": "2.11.0", "vllm": "0.24.0", "transformers": "5.9.0", "cupy-cuda13x": "14.0.1"}
    pins |= {"trl": "0.27.0", "flash-linear-attention": "0.5.2", "torchvision": "0.26.0", "torchaudio": "2.11.0"}
    assert {name: version.get(name) for name in pins} == pins
    assert Version(version["liger-kernel"]) >= Version("0.8.2")
    assert Version(version["hydra-core"]) >= Version("1.3")  # what verl's config code needs, not the 0.11 fallback
    assert version["cuda-toolkit"].startswith("13.0.")  # torch 2.11.0's CUDA: NVIDIA driver 580 or newer
    older = resolve_gpu_install(tmp_path, "x86_64-manylinux_2_28")  # docs/gpu.md: glibc 2.31 or newer
    assert older.returncode != 0 and "llguidance" in older.stderr


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
    assert "sdpa" in warnings[0] and "docs/gpu.md#flash-attn" in warnings[0]


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


# ------------------------------------------------------------------------------------------ tests/gpu/check_gpu.sh
def check_gpu(path: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """``bash tests/gpu/check_gpu.sh`` with PATH set to ``path`` and extra environment variables."""
    base = {k: v for k, v in os.environ.items() if k not in ("N_GPUS", "CUDA_VISIBLE_DEVICES", "DRY_RUN")}
    return subprocess.run(
        [shutil.which("bash"), str(ROOT / "tests" / "gpu" / "check_gpu.sh")],
        env={**base, "PATH": path, "OUT": str(tmp_path / "out"), **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_check_gpu_without_nvidia_smi_says_what_it_needs(tmp_path):
    """Without nvidia-smi the GPU count is unknown (it used to read as "0\\n0", an arithmetic error): one line."""
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if not (Path(p) / "nvidia-smi").exists())
    proc = check_gpu(path, tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [proc.stderr.strip()]  # one line
    assert proc.stderr.startswith("error: nvidia-smi is not on PATH: this check needs an NVIDIA GPU and its driver")
    assert "580" in proc.stderr and proc.stdout == ""


def test_check_gpu_prints_its_summary_when_the_recipe_fails(tmp_path):
    """The recipe stops (here: its model folder is missing) and the check still reports each metric as missing and
    the recipe's exit status. A stand-in ``nvidia-smi`` lists one GPU and a stand-in ``vllm`` package imports, so
    that the check reaches the recipe on a CPU machine."""
    tool = tmp_path / "bin" / "nvidia-smi"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000)'\n")
    tool.chmod(0o755)
    (tmp_path / "site" / "vllm").mkdir(parents=True)
    (tmp_path / "site" / "vllm" / "__init__.py").write_text("")
    pythonpath = os.pathsep.join(p for p in (str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")) if p)
    model = tmp_path / "no-model"
    proc = check_gpu(
        f"{tool.parent}{os.pathsep}{os.environ['PATH']}",
        tmp_path,
        PYTHON=sys.executable,
        PYTHONPATH=pythonpath,
        MODEL_PATH=str(model),
    )
    assert proc.returncode == 1
    assert f"checking verl-gigpo on 1 GPU(s) with {model} and {sys.executable}" in proc.stdout
    assert f"error: MODEL_PATH={model} does not exist" in proc.stdout  # the recipe's own message (tee), and its log
    assert f"error: MODEL_PATH={model} does not exist" in (tmp_path / "out" / "train.log").read_text()
    for metric in ("gigpo/step_group_size_mean", "env/success_rate", "actor/pg_loss", "val-core/sokoban"):
        assert f"MISSING {metric}\n" in proc.stderr
    assert "FAILED recipes/run_sokoban.sh exited with status 1;" in proc.stderr.splitlines()[-1]
