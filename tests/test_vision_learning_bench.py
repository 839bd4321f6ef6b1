"""``benchmarks/vision_learning.py --report-only`` (CPU only, no training): its RESULTS.md section from kept data
alone, with the before / best / after values and the training means computed by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import kept_data
        import vision_learning

        yield kept_data, vision_learning
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_the_section_from_kept_data(bench, tmp_path):
    kept_data, vl = bench
    argv = ["--seeds", "0", "--iters", "4", "--tasks", "2", "--group", "2", "--val-size", "4", "--test-freq", "2"]
    argv += ["--data", str(tmp_path / "kept"), "--runs", str(tmp_path / "runs")]
    args = vl.parse_args(argv)
    train = {"gigpo": [0.25, 0.5, 0.5, 0.75], "grpo": [0.25, 0.25, 0.5, 0.25]}
    val = {"gigpo": {0: 0.25, 2: 0.75, 4: 0.5}, "grpo": {0: 0.25, 2: 0.25, 4: 0.5}}
    for config in ("gigpo", "grpo"):
        rows = [{"training_step": 0, "val/success_rate": val[config][0]}]
        for step, success in enumerate(train[config], start=1):
            rows.append({"training_step": step, "env/success_rate": success})
            if step in val[config]:
                rows[-1]["val/success_rate"] = val[config][step]
        items = vl.overrides(config, 0, args, tmp_path / "runs" / config)
        settings = {"config": config, "seed": 0, "iters": 4, "tasks": 2, "group": 2, "val_size": 4, "test_freq": 2}
        kept_data.write_kept(
            kept_data.kept_file(args.data, config, 0), rows, overrides=items, args=settings, launch={"wall_s": 90.0}
        )
    results = tmp_path / "RESULTS.md"
    assert vl.main([*argv, "--report-only", "--results", str(results)]) == 0
    text = results.read_text()
    assert vl.HEADING in text
    assert "| gigpo | 0 | 0.25 | 0.75 | 0.50 | 0.50 -> 0.50 | 1.5 |" in text  # train mean of 4 iterations: 0.5
    assert "| grpo | 0 | 0.25 | 0.50 | 0.50 | 0.31 -> 0.31 | 1.5 |" in text
    assert "- gigpo: mean validation success 0.25 -> 0.50 over 1 seed(s)" in text
    # a kept file made with other settings is refused, naming the option
    assert vl.main([*argv[:-4], "--iters", "8", *argv[-4:], "--report-only", "--no-results"]) == 1


def test_a_variant_has_its_own_heading_overrides_and_kept_data(bench, tmp_path):
    kept_data, vl = bench
    argv = ["--seeds", "0", "--iters", "4", "--data", str(tmp_path / "kept"), "--runs", str(tmp_path / "runs")]
    args = vl.parse_args([*argv, "--tile-size", "28", "--max-steps", "3", "--lr", "5e-3"])
    assert vl.heading(args) == f"{vl.HEADING}, learning rate 0.005, 28-pixel cells, 3 steps"
    assert vl.heading(vl.parse_args(argv)) == vl.HEADING  # the defaults: the first section's heading
    items = vl.overrides("gigpo", 0, args, tmp_path / "runs" / "gigpo")
    assert {"env.kwargs.tile_size=28", "env.max_steps=3", "actor_rollout_ref.actor.optim.lr=0.005"} <= set(items)
    rows = [{"training_step": 0, "val/success_rate": 0.25}, {"training_step": 1, "env/success_rate": 0.5}]
    settings = {"config": "gigpo", "seed": 0, "iters": 4, "lr": 5e-3, "tile_size": 28, "max_steps": 3}
    kept_data.write_kept(
        kept_data.kept_file(args.data, "gigpo", 0), rows, overrides=items, args=settings, launch={"wall_s": 60.0}
    )
    assert "| gigpo | 0 | 0.25 | 0.25 | 0.25 | 0.50 -> 0.50 |" in vl.report(args)
    with pytest.raises(kept_data.KeptDataError, match="--tile-size 28"):  # kept at 28-pixel cells, asked at 16
        vl.report(vl.parse_args([*argv, "--max-steps", "3", "--lr", "5e-3"]))
    with pytest.raises(SystemExit):
        vl.parse_args([*argv, "--tile-size", "3"])


def test_the_what_was_tried_section(bench, tmp_path):
    kept_data, vl = bench
    rows = [{"training_step": 0, "val/success_rate": 0.25}]
    rows += [{"training_step": i, "env/success_rate": 0.1 * (i > 10), "actor/entropy": 1.0} for i in range(1, 21)]
    kept_data.write_kept(
        kept_data.kept_file(tmp_path / "tried", "a-setting", 0),
        rows,
        overrides=[],
        args={"setting": "random init, lr 3e-3", "outcome": "flat"},
    )
    results = tmp_path / "RESULTS.md"
    assert vl.main(["--tried-only", "--tried", str(tmp_path / "tried"), "--results", str(results)]) == 0
    text = results.read_text()
    assert vl.TRIED_HEADING in text
    assert "| random init, lr 3e-3 | 20 | 0.00 -> 0.10 | 1.00 -> 1.00 | 0.25 | flat |" in text


def test_the_starts_are_built_by_their_commands(bench, tmp_path):
    _, vl = bench
    argv = ["--data", str(tmp_path / "kept"), "--runs", str(tmp_path / "runs")]
    probe = vl.parse_args([*argv, "--probe-start", "0.5", "--probe-steps", "150"])
    assert probe.model == "artifacts/tiny-vl-gridnav-probe0.5-tile16-s150"
    assert vl.model_command(probe)[1:] == [
        "benchmarks/vision_probe.py",
        "--model",
        "artifacts/tiny-vl-gridnav",
        "--tile-sizes",
        "16",
        "--expert",
        "0.5",
        "--steps",
        "150",
        "--save",
        probe.model,
    ]
    assert vl.heading(probe).endswith("supervised start (an optimal move with probability 0.5)")
    imitate = vl.parse_args([*argv, "--imitate", "0.3", "--max-steps", "3"])
    assert vl.model_command(imitate)[-6:-4] == ["--imitate", "gridnav:0.3"]
    assert "--imitate-max-steps" in vl.model_command(imitate)
    for bad in (["--probe-start", "1.5"], ["--imitate", "0.3", "--probe-start", "0.5"]):
        with pytest.raises(SystemExit):
            vl.parse_args([*argv, *bad])
