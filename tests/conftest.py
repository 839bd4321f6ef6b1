"""Shared pytest fixtures. Helpers: APPEND your fixtures below; do not rewrite others' parts."""

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
