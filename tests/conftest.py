"""Session-scoped fixtures shared by the test modules, each built once per pytest session:

``tiny_model_dir``    a tiny random Qwen2 chat model with a gridnav-trained tokenizer (the local engine's tests);
``action_model_dir``  that model tuned to answer gridnav prompts with a valid action word (varied rollouts);
``alfworld_data``     a small synthetic ALFWorld data root made with alfworld's own game generation;
``ray_tq``            one local Ray cluster and one TransferQueue (the tests of verl's pipeline; marked ``slow``).
"""

from __future__ import annotations

import pytest


# ---------------------------------------------------------------------------------------------- tiny model (local/)
@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Qwen2 chat model + gridnav-trained tokenizer, built once per test session (~2 s).

    Hidden 64, 2 layers, 4 heads, MLP 128: small enough for fast CPU tests, same code path as the demo model.
    Load it with ``AutoTokenizer/AutoModelForCausalLM.from_pretrained(tiny_model_dir)``.
    """
    from verl_gigpo.local.tiny_model import build_tiny_model

    out = tmp_path_factory.mktemp("tiny-model")
    return build_tiny_model(
        out, hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, envs=("gridnav",), seed=0
    )


# ---------------------------------------------------------------------------------------- Ray + TransferQueue (verl)
@pytest.fixture(scope="session")
def ray_tq():
    """One local Ray cluster and one real TransferQueue for the whole test session (TQ init costs ~10-20 s on CPU).

    Settings that work on a 2-core machine: 16 *logical* Ray CPUs (with num_cpus=2 TransferQueue's storage actors
    starve and its calls hang silently) and a single storage unit.
    """
    import os

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

    out = tmp_path_factory.mktemp("alfworld-data")
    generate(
        out,
        games_per_type={"train": 1, "valid_seen": {"pick": 1, "clean": 1}, "valid_unseen": {"look": 1, "heat": 1}},
        seed=0,
    )
    return out


# ------------------------------------------------------------------------- a tiny model that answers in the format
@pytest.fixture(scope="session")
def action_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model after 40 supervised steps on gridnav prompts -> a uniformly random action word + EOS
    (``verl_gigpo.local.tiny_model.sft_action_format``, the ``--sft-actions`` option of its CLI).

    A random-init model almost never emits a parseable action, so its rollouts are all invalid steps with equal
    returns — a degenerate batch. This one replies with valid actions (in random directions), so rollouts have
    varied returns, wins and anchor groups, like a real model's. Takes a few seconds on CPU.
    """
    import shutil

    from verl_gigpo.local.tiny_model import sft_action_format

    out = tmp_path_factory.mktemp("action-model")
    shutil.copytree(tiny_model_dir, out, dirs_exist_ok=True)
    return sft_action_format(out, steps=40, seed=0)
