"""``benchmarks/scale_out.py``: a hand-computed row of the scale-out model, its optimizer steps against the
``gigpo_sync`` trainer mode's plan as the recipe's warning states it, and docs/multi-node.md holding exactly what the
script prints."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import scale_out  # noqa: E402
from scale_out import NODES, Assumptions, format_table  # noqa: E402


def test_one_node_by_hand():
    """6,400 steps x 65 ms + 35 s of resets on 16 cores; 50 x (120 / 200 + 16 x 853 / 50,000) s of generation;
    6,400 x 973 tokens x 10 x 1.5e9 FLOPs over 8 x 4e14 FLOP/s."""
    row = scale_out.scale_out(1, Assumptions())
    assert row.env_steps == 6400 and row.env_cpu_s == pytest.approx(451.0)
    assert row.env_wall_s == pytest.approx(451.0 / 16)
    assert row.generate_s == pytest.approx(50 * (0.6 + 16 * 853 / 50_000))
    assert row.update_s == pytest.approx(6400 * 973 * 10 * 1.5e9 / (8 * 4e14))
    assert row.prompt_tokens == pytest.approx(6400 * 853) and row.reply_tokens == pytest.approx(6400 * 120)
    assert row.iteration_s == pytest.approx(row.generate_s + row.env_wall_s + row.update_s)


def test_an_episodes_own_steps_bound_the_environment_time():
    """On many nodes the cores outnumber the work: an episode's 50 steps of 65 ms still run one after another."""
    row = scale_out.scale_out(64, Assumptions())
    assert row.env_wall_s == pytest.approx(50 * 0.065)


@pytest.mark.parametrize(("nodes", "rows", "steps", "micro"), [(1, 256, 25, 32), (2, 512, 13, 16), (8, 2048, 4, 4)])
def test_optimizer_steps_follow_the_recipes_rounding(nodes, rows, steps, micro):
    """The recipe warns at 2 nodes of 8 GPUs: 512 = NNODES x N_GPUS x lcm(32, 32) rows per step (tests of
    recipes/common.sh); a micro-batch of 256 / ranks restores 256-row steps."""
    row = scale_out.scale_out(nodes, Assumptions())
    assert (row.rows_per_optimizer_step, row.optimizer_steps, row.micro_batch_for_rows) == (rows, steps, micro)
    smaller = scale_out.scale_out(nodes, Assumptions(micro_batch_per_gpu=micro))
    assert (smaller.rows_per_optimizer_step, smaller.optimizer_steps) == (256, 25)


def test_docs_hold_the_table_the_script_prints():
    """Regenerate with ``python benchmarks/scale_out.py --write``."""
    doc = (ROOT / "docs" / "multi-node.md").read_text()
    block = doc.split(scale_out.BEGIN, 1)[1].split(scale_out.END, 1)[0]
    assert block == "\n" + format_table([scale_out.scale_out(n, Assumptions()) for n in NODES]) + "\n"
