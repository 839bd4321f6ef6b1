"""The benchmarks' kept data and paired comparisons (CPU only, no training): the kept file of the recorded verl run
(``tests/data/learning-verl``), the size budget of ``benchmarks/data/``, the runners' skipping of kept cells, a
section rebuilt from kept data alone equal to the section built from the runs, and the paired t with hand-computed
values.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
RECORDED = Path(__file__).resolve().parent / "data" / "learning-verl"


@pytest.fixture(scope="module")
def bm():
    """The benchmark modules (they import their neighbours, so benchmarks/ goes on the path)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import kept_data
        import learning
        import learning_run
        import learning_settings
        import paired

        yield SimpleNamespace(kept=kept_data, cli=learning, run=learning_run, settings=learning_settings, paired=paired)
    finally:
        sys.path.remove(str(BENCHMARKS))


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:] if end == -1 else text[start:end]


# ---------------------------------------------------------------------------------------------- paired t
@pytest.mark.parametrize(("df", "expected"), [(1, 12.7062), (2, 4.3027), (4, 2.7764), (9, 2.2622), (29, 2.0452)])
def test_t_quantile_matches_the_printed_table(bm, df, expected):
    """t_{0.975, df} as printed in every statistics table (e.g. NIST/SEMATECH e-Handbook, table 1.3.6.7.2)."""
    assert bm.paired.t_quantile(0.975, df) == pytest.approx(expected, abs=1e-4)
    assert bm.paired.t_two_sided_mass(expected, df) == pytest.approx(0.95, abs=1e-5)


def test_t_quantile_refuses_bad_arguments(bm):
    with pytest.raises(ValueError, match="df must be an integer >= 1, got 0"):
        bm.paired.t_quantile(0.975, 0)
    with pytest.raises(ValueError, match="p must lie in"):
        bm.paired.t_quantile(0.4, 3)


def test_paired_difference_by_hand(bm):
    """d = (0.4, 0.5, 0.1) over the seeds both hold (seed 3 has no baseline): mean 1/3, sd (ddof 1) 0.208167,
    half-width 4.302653 x 0.208167 / sqrt(3) = 0.517115."""
    diff = bm.paired.paired_difference({0: 0.5, 1: 0.7, 2: 0.1, 3: 0.9}, {0: 0.1, 1: 0.2, 2: 0.0})
    assert diff["n"] == 3
    assert diff["mean"] == pytest.approx(1 / 3)
    assert diff["low"] == pytest.approx(1 / 3 - 0.517115, abs=1e-5)
    assert diff["high"] == pytest.approx(1 / 3 + 0.517115, abs=1e-5)
    assert bm.paired.format_difference(diff) == "+0.33 [-0.18, +0.85]"
    one = bm.paired.paired_difference({0: 0.5}, {0: 0.25})
    assert bm.paired.format_difference(one) == "+0.25 (1 seed)" and np.isnan(one["low"])


# ---------------------------------------------------------------------------------------------- kept files
def test_the_recorded_verl_run_kept_and_read_back(bm, tmp_path):
    """``keep`` on the recorded verl run: the header names format, version, commit, overrides, arguments and the
    launch record; the rows are every scalar key of every iteration, floats to 7 significant digits."""
    run_dir = RECORDED / "verl" / "gigpo_s0"
    args = SimpleNamespace(seeds=1, iters=2, command="python benchmarks/learning.py --engine verl")
    path = bm.run.keep(run_dir, "verl", tmp_path / "verl" / "gigpo-seed0.jsonl.gz", ["platform=cpu"], args)
    header, rows = bm.kept.read_kept(path)
    assert (header["format"], header["version"]) == (bm.kept.FORMAT, bm.kept.VERSION)
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?|unknown", header["commit"])
    assert header["command"] == args.command and header["overrides"] == ["platform=cpu"]
    assert header["args"] == {"seeds": 1, "iters": 2}
    assert header["launch"] == json.loads((run_dir / "launch.json").read_text())
    original = bm.run.read_run(run_dir, "verl")
    assert [set(r) for r in rows] == [set(r) for r in original] and len(rows) == 3
    for kept, raw in zip(rows, original, strict=True):
        for key, value in raw.items():
            assert kept[key] == pytest.approx(value, rel=1e-6), key
    # the report reads the kept file first and the run folder when there is none
    assert bm.run.load_run(RECORDED / "verl", tmp_path, "verl/gigpo", 0, "verl") == (rows, header["launch"])
    assert bm.run.load_run(RECORDED / "verl", tmp_path / "none", "verl/gigpo", 0, "verl")[0] == original
    assert bm.run.load_run(tmp_path / "none", tmp_path / "none", "verl/gigpo", 0, "verl") == ([], None)


def test_a_kept_file_of_another_version_is_refused(bm, tmp_path):
    path = tmp_path / "x-seed0.jsonl.gz"
    path.write_bytes(gzip.compress(json.dumps({"format": bm.kept.FORMAT, "version": 99}).encode()))
    with pytest.raises(ValueError, match="version 99"):
        bm.kept.read_kept(path)


def test_kept_data_stay_within_the_stated_budget(bm, tmp_path):
    """Everything under benchmarks/data/ together within BUDGET_BYTES, the budget docs/benchmarks.md states; a
    150-iteration local run with the recorded run's keys (values varied) fits 40 times in it (issue 37's local
    experiment: 4 configurations x 10 seeds)."""
    assert bm.kept.total_bytes(bm.kept.DATA) <= bm.kept.BUDGET_BYTES
    assert f"{bm.kept.BUDGET_BYTES / 1e6:.0f} MB" in (ROOT / "docs" / "benchmarks.md").read_text()
    template = json.loads((RECORDED / "local" / "gigpo_s0" / "metrics.jsonl").read_text().splitlines()[1])
    rng = np.random.default_rng(0)
    rows = [
        {k: v * rng.uniform(0.5, 1.5) if isinstance(v, float) else v for k, v in template.items()} | {"step": i}
        for i in range(1, 151)
    ]
    size = bm.kept.write_kept(tmp_path / "x-seed0.jsonl.gz", rows, overrides=[], args={}).stat().st_size
    assert 40 * size <= bm.kept.BUDGET_BYTES, size


# ---------------------------------------------------------------------------------------------- runners and report
#: validation success at iterations 0, 2 and 4 per configuration and seed 0, 1, 2 (the paired differences below are
#: computed by hand from them)
VAL = {
    "gigpo": [(1 / 128, 0.25, 0.5), (0.0, 0.5, 0.75), (3 / 128, 0.25, 0.25)],
    "grpo": [(1 / 128, 0.0, 0.25), (0.0, 0.25, 0.25), (3 / 128, 0.25, 0.25)],
}
ARGV = ["--engine", "local", "--configs", "gigpo,grpo", "--seeds", "3", "--iters", "4", "--test-freq", "2"]


def _write_run(run_dir: Path, val: tuple[float, ...], seed: int) -> None:
    """A finished 4-iteration local-engine run with the recorded run's keys (validation rows: its step-0 row's keys,
    iteration rows: its step-1 row's), timings and train success drawn at random, validations ``val``."""
    template = [json.loads(x) for x in (RECORDED / "local" / "gigpo_s0" / "metrics.jsonl").read_text().splitlines()]
    iteration = {k: v for k, v in template[1].items() if k not in template[0] or k in ("step", "training_step")}
    rng = np.random.default_rng(seed)
    rows = []
    for step in range(5):
        row = (
            {}
            if step == 0
            else {k: v * rng.uniform(0.5, 1.5) if isinstance(v, float) else v for k, v in iteration.items()}
        )
        if step % 2 == 0:
            row.update(template[0])
            success = val[step // 2]
            row.update({"val/success_rate": success, "val-core/gridnav/acc/mean@1": success})
            row["timing_s/testing"] = row["timing_s/val"] = float(rng.uniform(0.1, 0.3))
        if step:
            row["env/success_rate"] = float(rng.integers(0, 65)) / 64
            row["rollout/episodes_played_total"] = 4.0 * step  # 2 tasks x 2 episodes per iteration
            row["timing_s/step"] = float(rng.uniform(1.0, 3.0))
        row.update({"step": float(step), "training_step": float(step)})
        rows.append(row)
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _trainer(trained: list[str]):
    """Stands in for the local engine's process (``learning_run._run_local``): writes a finished run where the
    overrides say and records its label."""

    def train(overrides: list[str], label: str) -> None:
        out = Path(next(o.split("=", 1)[1] for o in overrides if o.startswith("trainer.default_local_dir=")))
        name, seed = out.name.rsplit("_s", 1)
        shutil.rmtree(out, ignore_errors=True)
        _write_run(out, VAL[name][int(seed)], int(seed))
        trained.append(label)

    return train


def test_runners_keep_finished_runs_skip_kept_cells_and_rerun_on_request(bm, tmp_path, monkeypatch):
    runs, data = tmp_path / "runs", tmp_path / "kept"
    trained: list[str] = []
    monkeypatch.setattr(bm.run, "_run_local", _trainer(trained))
    args, names = bm.cli.parse_args([*ARGV, "--runs", str(runs), "--data", str(data)])
    cells = [(n, s) for s in range(3) for n in names]
    _write_run(runs / "gigpo_s0", VAL["gigpo"][0], 0)  # finished before the benchmark started: only kept
    for name, seed in cells:
        bm.run.run_one(name, seed, args)
    assert trained == [f"{n} seed {s}" for n, s in cells[1:]]
    assert sorted(p.name for p in data.iterdir()) == sorted(f"{n}-seed{s}.jsonl.gz" for n, s in cells)
    header, rows = bm.kept.read_kept(data / "grpo-seed1.jsonl.gz")
    assert [r["val/success_rate"] for r in rows if "val/success_rate" in r] == list(VAL["grpo"][1])
    assert "trainer.seed=1" in header["overrides"] and header["args"]["iters"] == 4

    # interrupted before grpo seed 2 was kept, its run folder gone: only that cell runs again
    trained.clear()
    (data / "grpo-seed2.jsonl.gz").unlink()
    shutil.rmtree(runs)
    for name, seed in cells:
        bm.run.run_one(name, seed, args)
    assert trained == ["grpo seed 2"]

    # a kept cell from a run with other settings is refused, not skipped
    other, _ = bm.cli.parse_args([*ARGV, "--iters", "5", "--runs", str(runs), "--data", str(data)])
    with pytest.raises(ValueError, match=r"gigpo-seed0.jsonl.gz: kept from a run with other settings .*steps=4"):
        bm.run.run_one("gigpo", 0, other)

    trained.clear()
    args.rerun = True
    for name, seed in cells:
        bm.run.run_one(name, seed, args)
    assert trained == [f"{n} seed {s}" for n, s in cells]


def test_a_section_rebuilt_from_kept_data_alone_equals_the_one_from_the_runs(bm, tmp_path, monkeypatch, capsys):
    """The local benchmark's section from the run folders, then every cell kept by the runner, the run folders
    removed (a fresh clone) and the section rebuilt by ``--report-only`` from the kept data alone: the same text,
    paired table included (hand-computed below)."""
    runs, data = tmp_path / "runs", tmp_path / "kept"
    for name, per_seed in VAL.items():
        for seed, val in enumerate(per_seed):
            _write_run(runs / f"{name}_s{seed}", val, seed)
    argv = [*ARGV, "--runs", str(runs), "--data", str(data)]
    results = tmp_path / "out" / "RESULTS.md"
    results.parent.mkdir()
    assert bm.cli.main([*argv, "--report-only", "--results", str(results)]) == 0
    from_runs = results.read_text()
    results.unlink()
    assert not data.exists()  # the report reads; only runners keep

    def no_training(overrides, label):
        raise AssertionError(f"{label} is finished: it must only be kept")

    monkeypatch.setattr(bm.run, "_run_local", no_training)
    args, names = bm.cli.parse_args(argv)
    for seed in range(3):
        for name in names:
            bm.run.run_one(name, seed, args)
    shutil.rmtree(runs)
    assert bm.cli.main([*argv, "--report-only", "--results", str(results)]) == 0
    section = _section(from_runs, bm.settings.SECTION)
    assert _section(results.read_text(), bm.settings.SECTION) == section
    assert (results.parent / "learning.png").read_bytes()[:4] == b"\x89PNG"
    assert f"Kept data: `{data}/`" in section
    # final: d = (0.25, 0.5, 0): mean 0.25, sd 0.25, half-width 4.302653 x 0.25 / sqrt(3) = 0.621;
    # mean over iterations 2 and 4: d = (0.25, 0.375, 0): mean 0.2083, sd 0.19094, half-width 0.4743
    assert "| gigpo | grpo | 3 | +0.25 [-0.37, +0.87] | +0.21 [-0.27, +0.68] |" in section

    # a report with other settings than the kept runs' is refused in one line (the table would mislabel them)
    capsys.readouterr()
    assert bm.cli.main([*argv, "--iters", "5", "--report-only", "--no-results"]) == 2
    err = capsys.readouterr().err
    assert "gigpo-seed0.jsonl.gz: kept with --iters 4, this report asks 5" in err and len(err.splitlines()) == 1

    shutil.rmtree(data)
    assert bm.cli.main([*argv, "--report-only", "--no-results"]) == 1


def test_the_side_by_side_section_from_the_recorded_runs_kept(bm, tmp_path, capsys):
    """The recorded verl run and its local twin, kept by the runners (``run_verl``, ``run_twin``: finished, so only
    kept, the launch record with them), rebuild the side-by-side section without their folders."""
    runs, data = tmp_path / "runs", tmp_path / "kept"
    shutil.copytree(RECORDED, runs)
    argv = (
        "--engine verl --configs gigpo --seeds 1 --iters 2 --tasks 2 --group 2 --val-size 2 --test-freq 1 --task goal"
    )
    argv = [*argv.split(), "--opt-steps", "1", "--runs", str(runs), "--data", str(data), "--report-only"]
    results = tmp_path / "out" / "RESULTS.md"
    results.parent.mkdir()
    assert bm.cli.main([*argv, "--results", str(results)]) == 0
    from_runs = results.read_text()
    results.unlink()
    args, _ = bm.cli.parse_args([a for a in argv if a != "--report-only"])
    bm.run.run_verl("gigpo", 0, args, tmp_path / "tasks")
    bm.run.run_twin("gigpo", 0, args)
    assert sorted(str(p.relative_to(data)) for p in data.rglob("*.gz")) == [
        "local/gigpo-seed0.jsonl.gz",
        "verl/gigpo-seed0.jsonl.gz",
    ]
    shutil.rmtree(runs)
    assert bm.cli.main([*argv, "--results", str(results)]) == 0
    section = _section(from_runs, bm.settings.SECTION_VERL)
    assert _section(results.read_text(), bm.settings.SECTION_VERL) == section
    assert "Per verl launch, outside iterations and validations" in section  # from the kept launch record
    assert "No paired comparison: the baseline `grpo`" in section


def test_the_dynamic_sampling_section_rebuilt_from_kept_data(bm, tmp_path, monkeypatch):
    """``benchmarks/dynamic_sampling.py``: the section from the runs equals the one from their kept data alone, with
    the paired differences from ``gigpo`` computed by hand (2 seeds: t_{0.975, 1} = 12.7062)."""
    import dynamic_sampling as ds

    val = {"gigpo": [(0.0, 0.25, 0.5), (0.0, 0.5, 0.5)], "gigpo_signal": [(0.0, 0.5, 0.75), (0.0, 0.25, 1.0)]}
    runs, data = tmp_path / "runs", tmp_path / "kept"
    for name, per_seed in val.items():
        for seed, v in enumerate(per_seed):
            _write_run(runs / f"{name}_s{seed}", v, seed)
    argv = ["--configs", "gigpo,gigpo_signal", "--seeds", "2", "--iters", "4", "--tasks", "2", "--group", "2"]
    argv += ["--test-freq", "2", "--runs", str(runs), "--data", str(data)]
    results = tmp_path / "out" / "RESULTS.md"
    results.parent.mkdir()
    assert ds.main([*argv, "--report-only", "--results", str(results)]) == 0
    from_runs = results.read_text()
    results.unlink()

    def no_training(overrides, label):
        raise AssertionError(f"{label} is finished: it must only be kept")

    monkeypatch.setattr(ds, "_run_local", no_training)
    args = ds.parse_args(argv)
    for seed in range(2):
        for name in val:
            ds.run_one(name, seed, args)
    shutil.rmtree(runs)
    assert ds.main([*argv, "--report-only", "--results", str(results)]) == 0
    section = _section(from_runs, ds.SECTION)
    assert _section(results.read_text(), ds.SECTION) == section
    # final: d = (0.25, 0.5): mean 0.375, sd 0.17678, half-width 12.7062 x 0.17678 / sqrt(2) = 1.5883;
    # mean over iterations 2 and 4: d = (0.25, 0.125): mean 0.1875, sd 0.08839, half-width 0.7941
    assert "| gigpo_signal | gigpo | 2 | +0.38 [-1.21, +1.96] | +0.19 [-0.61, +0.98] |" in section
    assert "validation on 128 fixed test-split tasks" in section and f"Kept data: `{data}/`" in section
