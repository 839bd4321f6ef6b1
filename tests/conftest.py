"""Session-scoped fixtures shared by the test modules, each built once per pytest session:

``tiny_model_dir``    a tiny random Qwen2 chat model with a gridnav-trained tokenizer (the local engine's tests);
``action_model_dir``  that model tuned to answer gridnav prompts with a valid action word (varied rollouts);
``alfworld_data``     a small synthetic ALFWorld data root made with alfworld's own game generation;
``ray_tq``            one local Ray cluster and one TransferQueue (the tests of verl's pipeline; marked ``slow``).

``make test`` runs two pytest workers (pytest-xdist, ``--dist loadfile``). The models and the ALFWorld data are
built once for both (:func:`_built_once`, under a file lock); every test file runs on one worker, and the files
that use ``ray_tq`` run on the same one (:func:`pytest_xdist_make_scheduler`), so one Ray cluster and one
TransferQueue serve them all.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

#: test files run last: verl's whole pipeline (the e2e's GiGPO launches ~4-5 min, the GRPO + LoRA launch and the
#: two-node launch ~2-3 min each; their launches keep both cores busy). Under two workers they then share the
#: machine only with each other and the last other files (measured: the e2e file first, beside the Ray files and
#: the quick ones, made the whole suite slower, 866 s against 790 s)
RUN_LAST = ("test_e2e_verl_cpu.py", "test_e2e_verl_cpu_grpo_lora.py", "test_multinode.py")

#: the test files that use ``ray_tq``: under pytest-xdist they run on one worker, so one Ray cluster and one
#: TransferQueue serve them all (each costs ~10-30 s to start); a test using ``ray_tq`` elsewhere is an error
RAY_FILES = (
    "test_verl_agent_loop_trainer.py",
    "test_verl_dynamic_sampling.py",
    "test_verl_env_deadlines.py",
    "test_verl_plugin.py",
)


def pytest_collection_modifyitems(config, items):
    """Move the tests of :data:`RUN_LAST` to the end, keeping every other order as collected.

    Raises:
        pytest.UsageError: a test uses ``ray_tq`` in a file that :data:`RAY_FILES` does not list.
    """

    items.sort(key=lambda item: item.path.name in RUN_LAST)
    stray = sorted({item.path.name for item in items if "ray_tq" in getattr(item, "fixturenames", ())} - set(RAY_FILES))
    if stray:
        raise pytest.UsageError(f"{stray} use the ray_tq fixture: add them to RAY_FILES in tests/conftest.py")


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: no error where it is not installed
def pytest_xdist_make_scheduler(config, log):
    """With ``--dist loadfile``: xdist's file-by-file scheduling, except that the files of :data:`RAY_FILES` form
    one unit (one worker runs them, in order). Other modes: xdist's own scheduler."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FilesWithRayTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "ray" if Path(path).name in RAY_FILES else path

    return FilesWithRayTogether(config, log)


def _built_once(tmp_path_factory, name: str, build: Callable[[Path], Path]) -> Path:
    """``build(folder)`` once per test session, shared by the pytest-xdist workers: the first worker builds under
    a file lock in the session's common temporary folder and the others wait, then read it. Returns what
    ``build`` returned (a path inside ``folder``)."""
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the folder every worker's own temporary folder sits in
    folder, done = root / f"shared-{name}", root / f"shared-{name}.done"
    with FileLock(str(root / f"shared-{name}.lock")):
        if not done.exists():
            folder.mkdir(parents=True, exist_ok=True)
            done.write_text(str(build(folder)))
    return Path(done.read_text())


@pytest.fixture(autouse=True)
def _verl_logging_level_restored():
    """Give the next test the ``VERL_LOGGING_LEVEL`` this one found: the CLIs the tests run in-process (``evaluate``,
    ``probe``) set it to WARNING for their own run, which would hide the plug-in's load line from the subprocesses
    later tests start."""
    before = os.environ.get("VERL_LOGGING_LEVEL")
    yield
    if before is None:
        os.environ.pop("VERL_LOGGING_LEVEL", None)
    else:
        os.environ["VERL_LOGGING_LEVEL"] = before


# ------------------------------------------------------------------------------------------------ tiny model (dev/)
@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Qwen2 chat model + gridnav-trained tokenizer, built once per test session (~2 s).

    Hidden 64, 2 layers, 4 heads, MLP 128: small enough for fast CPU tests, same code path as the demo model.
    Load it with ``AutoTokenizer/AutoModelForCausalLM.from_pretrained(tiny_model_dir)``.
    """
    from verl_gigpo.dev.tiny_model import build_tiny_model

    def build(out: Path) -> Path:
        return build_tiny_model(
            out, hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, envs=("gridnav",), seed=0
        )

    return _built_once(tmp_path_factory, "tiny-model", build)


@pytest.fixture(scope="session")
def tiny_vl_model_dir(tmp_path_factory):
    """A tiny random Qwen2.5-VL (verl_gigpo.dev.tiny_vl_model; tokenizer of gridnav and Sokoban), built once (~3 s)."""
    from verl_gigpo.dev.tiny_vl_model import build_tiny_vl_model

    def build(out: Path) -> Path:
        return build_tiny_vl_model(out, envs=("gridnav", "sokoban"))

    return _built_once(tmp_path_factory, "tiny-vl-model", build)


# ---------------------------------------------------------------------------------------- Ray + TransferQueue (verl)
@pytest.fixture(scope="session")
def ray_tq():
    """One local Ray cluster and one real TransferQueue for the whole test session (TQ init costs ~10-20 s on CPU);
    under pytest-xdist, the files that use it share one worker (:data:`RAY_FILES`).

    Settings that work on a 2-core machine: 16 *logical* Ray CPUs (with num_cpus=2 TransferQueue's storage actors
    starve and its calls hang silently) and a single storage unit.
    """
    import ray
    import transfer_queue as tq
    from omegaconf import OmegaConf

    env_vars = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    ray.init(
        num_cpus=16,
        include_dashboard=False,
        log_to_driver=bool(os.getenv("GIGPO_TEST_RAY_LOGS")),
        runtime_env={"env_vars": env_vars},
    )
    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
    yield
    tq.close()
    ray.shutdown()


# ------------------------------------------------------------------------------------ ALFWorld (synthetic games)
@pytest.fixture(scope="session")
def alfworld_data(tmp_path_factory):
    """A small synthetic ALFWorld data root, generated once per session (~5-10 s on 2 cores) with alfworld's own
    game generation: train has one game of each of the six task types; valid_seen has a pick and a clean game,
    valid_unseen a look and a heat game. Returns the root (pass it as ``data_path`` or ``ALFWORLD_DATA``)."""
    from environments.alfworld.synth import generate

    def build(out: Path) -> Path:
        games = {"train": 1, "valid_seen": {"pick": 1, "clean": 1}, "valid_unseen": {"look": 1, "heat": 1}}
        generate(out, games_per_type=games, seed=0)
        return out

    return _built_once(tmp_path_factory, "alfworld-data", build)


# ------------------------------------------------------------------------- a tiny model that answers in the format
@pytest.fixture(scope="session")
def action_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model after 40 supervised steps on gridnav prompts -> a uniformly random action word + EOS
    (``verl_gigpo.dev.tiny_model.sft_action_format``, the ``--sft-actions`` option of its CLI).

    A random-init model almost never emits a parseable action, so its rollouts are all invalid steps with equal
    returns — a degenerate batch. This one replies with valid actions (in random directions), so rollouts have
    varied returns, wins and anchor groups, like a real model's. Takes a few seconds on CPU.
    """
    import shutil

    from verl_gigpo.dev.tiny_model import sft_action_format

    def build(out: Path) -> Path:
        shutil.copytree(tiny_model_dir, out, dirs_exist_ok=True)
        return sft_action_format(out, steps=40, seed=0)

    return _built_once(tmp_path_factory, "action-model", build)
