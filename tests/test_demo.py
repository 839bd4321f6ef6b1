"""`make demo` in its shortened mode (DEMO_ITERS=2), as a subprocess like make runs it (CPU-only)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_make_demo_target_runs_the_demo_module_cpu():
    out = subprocess.run(["make", "-n", "demo"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert "-m verl_gigpo.local.demo" in out


@pytest.mark.slow
def test_demo_shortened_mode_cpu(tiny_model_dir, tmp_path):
    env = {
        **os.environ,
        "DEMO_ITERS": "2",
        "DEMO_SEED": "1",
        "DEMO_OUT": str(tmp_path / "run"),
        "DEMO_MODEL": str(tiny_model_dir),  # the session's tiny model (building the full-size one is tested apart)
        "HF_HUB_OFFLINE": "1",
    }
    # a smaller validation set keeps the shortened mode quick; everything else is the demo's configuration
    cmd = [sys.executable, "-m", "verl_gigpo.local.demo", "data.val_size=16", "local.progress=false"]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    text = done.stdout
    assert "validation success before training:" in text and "validation success after training:" in text
    assert f"metrics: {tmp_path / 'run' / 'metrics.jsonl'}" in text
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["training_step"] for m in lines] == [0.0, 1.0, 2.0]
    # validation before training and after the last iteration: fractions of the 16 validation episodes (val n=1),
    # the numbers the demo printed
    before, after = lines[0]["val/success_rate"], lines[-1]["val/success_rate"]
    for rate in (before, after):
        assert 0.0 <= rate <= 1.0 and (rate * 16).is_integer(), rate
    assert f"validation success before training: {before:.3f}" in text
    assert f"validation success after training:  {after:.3f}" in text
    assert "gigpo/num_step_groups" in lines[-1]
    assert (tmp_path / "run" / "learning_curve.png").stat().st_size > 1000
    # credit records every max(1, iters // 4) = 1 iterations, and the report on them at the end
    credit = tmp_path / "run" / "credit"
    assert sorted(p.name for p in credit.glob("iter_*.jsonl")) == ["iter_1.jsonl", "iter_2.jsonl"]
    assert f"credit report: {credit / 'report' / 'credit_report.html'}" in text
    assert "top-credited (state, action) pairs" in text
    assert (credit / "report" / "credit_report.html").read_text().count("data:image/png;base64,") == 2


def test_demo_start_is_checked_before_anything_is_built_cpu(tmp_path, capsys):
    """DEMO_START names one of the two starts (random weights + action constraint, or the imitation model)."""
    from verl_gigpo.local.demo import START_OVERRIDES, main

    assert set(START_OVERRIDES) == {"random", "imitate"}
    # the imitation start samples over the full vocabulary, with room for the action word, EOS and one spare token
    assert "local.constrain_to_actions=false" in START_OVERRIDES["imitate"][1]
    with pytest.raises(SystemExit) as exit_info:
        main(["--start", "bogus", "--out", str(tmp_path / "run"), "--model", str(tmp_path / "model")])
    assert exit_info.value.code == 2
    assert "--start / DEMO_START must be one of random, imitate, got 'bogus'" in capsys.readouterr().err
    assert not (tmp_path / "model").exists() and not (tmp_path / "run").exists()


def test_the_imitation_start_plays_the_task_its_model_imitates_cpu():
    """The imitation start's overrides are the task its model is built on (gridnav with a key, no history)."""
    from verl_gigpo.local.config import load_config
    from verl_gigpo.local.demo import DEMO_OVERRIDES, IMITATE_TASK, START_ITERS, START_OVERRIDES

    cfg = load_config([*DEMO_OVERRIDES, *START_OVERRIDES["imitate"][1]])
    assert dict(cfg.env.kwargs) == IMITATE_TASK
    assert cfg.env.max_steps == 15 and cfg.env.history_length == 0
    assert START_ITERS == {"random": 200, "imitate": 100}
