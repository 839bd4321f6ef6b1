"""``benchmarks/vision_probe.py`` (CPU only, seconds): the 72 drawn states of 3x3 gridnav and their optimal moves,
and one supervised step that saves a start model."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def vision_probe():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import vision_probe

        yield vision_probe
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_the_states_and_their_optimal_moves(vision_probe):
    images, optimal = vision_probe.states(16)
    assert len(images) == 72 and optimal.shape == (72, 4)  # 9 x 8 (agent, goal) pairs
    assert images[0].size == (48, 48)
    # the first state: agent (0, 0), goal (0, 1): only "right" (columns: up, down, left, right)
    assert optimal[0].tolist() == [False, False, False, True]
    # agent (0, 0), goal (2, 2) (the 8th pair): down or right
    assert optimal[7].tolist() == [False, True, False, True]
    assert optimal.sum(-1).min() >= 1 and optimal.sum(-1).max() <= 2
    drawn = {np.asarray(image).tobytes() for image in images}
    assert len(drawn) == 72  # every state has its own drawing


def test_one_soft_target_step_saves_a_start_model(vision_probe, tiny_vl_model_dir, tmp_path):
    from transformers import AutoModelForImageTextToText

    out = vision_probe.probe(str(tiny_vl_model_dir), 16, 1e-3, 1, expert=0.5, save=str(tmp_path / "start"))
    assert [step for step, *_ in out] == [0]
    step, loss, accuracy, p_opt = out[0]
    assert np.isfinite(loss) and 0 <= accuracy <= 1 and 0 < p_opt < 1
    before = AutoModelForImageTextToText.from_pretrained(tiny_vl_model_dir, dtype=torch.float32).state_dict()
    after = AutoModelForImageTextToText.from_pretrained(tmp_path / "start", dtype=torch.float32).state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # one Adam step moved the weights
    assert (tmp_path / "start" / "processor_config.json").is_file()  # the processor travels with it
