"""``benchmarks/learning.py --engine verl``: the learning benchmark through verl's own pipeline on this CPU.

One run of the script as users run it — 1 seed x 2 iterations of GiGPO through ``python -m verl_gigpo.main
platform=cpu`` with its local-engine twin beside — into a temporary folder and a temporary RESULTS.md. It checks
that the script works and writes its table, from what the runs wrote: verl's own file-logger metrics, the run
folders, the section and the plot. No learning outcome is asserted (2 iterations of a tiny model; the benchmark's
numbers live in benchmarks/RESULTS.md). About 3-4 minutes on 2 cores, most of it verl's start-up.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS = REPO / "benchmarks"


@pytest.fixture(scope="module")
def learning():
    """The benchmark script as a module (it imports its neighbour results_md, so benchmarks/ goes on the path)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import learning

        yield learning
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.fixture(scope="module")
def run(action_model_dir, tmp_path_factory):
    """One side-by-side run: 2 tasks x 2 episodes, 2 iterations, validation on 2 tasks after every iteration."""
    out = tmp_path_factory.mktemp("learning-verl")
    results = out / "RESULTS.md"
    results.write_text("# Benchmark results\n\n## Another benchmark\n\nkept as it is\n")
    real = BENCHMARKS / "RESULTS.md"
    real_before = hashlib.sha256(real.read_bytes()).hexdigest() if real.exists() else None
    cmd = [
        sys.executable,
        "benchmarks/learning.py",
        "--engine",
        "verl",
        "--configs",
        "gigpo",
        "--seeds",
        "1",
        "--iters",
        "2",
        "--tasks",
        "2",
        "--group",
        "2",
        "--val-size",
        "2",
        "--test-freq",
        "1",
        "--task",
        "goal",
        "--opt-steps",
        "1",
        "--model",
        str(action_model_dir),
        "--runs",
        str(out / "runs"),
        "--results",
        str(results),
    ]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1200)
    real_after = hashlib.sha256(real.read_bytes()).hexdigest() if real.exists() else None
    return {"done": done, "out": out, "results": results, "real_unchanged": real_before == real_after}


def test_the_script_exits_0_and_leaves_the_real_results_alone(run):
    done = run["done"]
    assert done.returncode == 0, f"stdout:\n{done.stdout[-4000:]}\nstderr:\n{done.stderr[-4000:]}"
    assert run["real_unchanged"], "the test wrote into benchmarks/RESULTS.md"


def test_verl_logged_every_iteration_and_validation_with_one_optimizer_step(run, learning):
    rows = learning.read_run(run["out"] / "runs" / "verl" / "gigpo_s0", "verl")
    assert [r["training_step"] for r in rows if "actor/pg_loss" in r] == [1.0, 2.0]
    # validation before training and after each iteration (test_freq 1): verl's val-core metric, renamed
    assert [r["training_step"] for r in rows if "val/success_rate" in r] == [0.0, 1.0, 2.0]
    for r in rows:
        if "actor/pg_loss" in r:
            # the mapped settings reached verl: one optimizer step per iteration, the shared learning rate
            assert r["update/num_mini_batches"] == 1.0
            assert r["actor/lr"] == pytest.approx(1e-3)
            assert r["gigpo/num_episode_groups"] == 2.0
    twin = learning.read_run(run["out"] / "runs" / "local" / "gigpo_s0", "local")
    assert [r["training_step"] for r in twin if "val/success_rate" in r] == [0.0, 1.0, 2.0]


def test_the_section_holds_the_mapping_both_engines_and_the_plot(run, learning):
    text = run["results"].read_text()
    assert "## Another benchmark\n\nkept as it is" in text
    assert text.count(learning.SECTION_VERL) == 1
    section = text[text.index(learning.SECTION_VERL) :]
    assert "python benchmarks/learning.py --engine verl" in section
    # the settings table: 2 tasks x 2 episodes x 10 steps = 40 rows per optimizer step at most on verl
    assert "`trainer.v1.gigpo_sync.mini_batch_rows=40`" in section
    assert "`local.constrain_to_actions=false`" in section
    assert "| verl | gigpo | 1 |" in section
    assert "| local | gigpo | 1 |" in section
    assert "- verl gigpo: s0 " in section
    assert "| **training iteration** |" in section
    png = run["results"].parent / "learning_verl.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
