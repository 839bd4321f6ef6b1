"""``benchmarks/learning.py``: its reading, tables and plot on recorded runs, and its launches' overrides through the
configs that check them.

``tests/data/learning-verl/`` holds what one real side-by-side run wrote (the files as written, nothing edited):
``python benchmarks/learning.py --engine verl --configs gigpo --seeds 1 --iters 2 --tasks 2 --group 2 --val-size 2
--test-freq 1 --task goal --opt-steps 1`` with the tiny action model — verl's file-logger output
(``verl/gigpo_s0/ckpt/metrics.jsonl``: validation at 0, iterations 1-2 with validation) and ``launch.json``, and its
local twin's ``local/gigpo_s0/metrics.jsonl`` (the local engine writes verl's run-level names beside its own).
The report is built from them by the script's own ``--report-only``.

The launches themselves: the verl run's overrides (:func:`learning_settings.verl_overrides`, with the task files the
script writes) compose through verl's Hydra config and pass verl's ``validate_config``, this package's preflight (what
``python -m verl_gigpo.main`` checks before Ray) and the cpu platform's check; the local runs' overrides pass the local
engine's config check, and every setting the table shares holds the same value on both engines. verl's pipeline runs
live once in the suite: ``tests/test_e2e_verl_cpu.py``.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
DATA = Path(__file__).resolve().parent / "data" / "learning-verl"
#: the recorded run's command line (without --model, --runs, --results)
ARGV = "--engine verl --configs gigpo --seeds 1 --iters 2 --tasks 2 --group 2 --val-size 2 --test-freq 1 --task goal"
ARGV_VERL = [*ARGV.split(), "--opt-steps", "1"]


@pytest.fixture(scope="module")
def lb():
    """The benchmark's modules (they import their neighbours, so benchmarks/ goes on the path)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import learning
        import learning_report
        import learning_run
        import learning_settings

        yield SimpleNamespace(cli=learning, report=learning_report, run=learning_run, settings=learning_settings)
    finally:
        sys.path.remove(str(BENCHMARKS))


def _raw(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
def runs(tmp_path):
    """A copy of the recorded runs (the report must not write next to the test data)."""
    shutil.copytree(DATA, tmp_path / "runs")
    return tmp_path / "runs"


# ---------------------------------------------------------------------------------------------- reading
def test_verl_rows_are_the_file_loggers_records_in_order(lb):
    raw = _raw(DATA / "verl" / "gigpo_s0" / "ckpt" / "metrics.jsonl")
    rows = lb.run.read_run(DATA / "verl" / "gigpo_s0", "verl")
    assert rows == [{"step": r["step"], **r["data"]} for r in raw]
    assert [r["step"] for r in rows if "actor/pg_loss" in r] == [1, 2]
    assert [lb.run.val_success(r) for r in rows] == [r["data"]["val-core/gridnav/acc/mean@1"] for r in raw]
    assert lb.run.finished(DATA / "verl" / "gigpo_s0", "verl", 2)
    assert not lb.run.finished(DATA / "verl" / "gigpo_s0", "verl", 3)


def test_local_rows_carry_verls_run_level_names(lb):
    """The local engine writes verl's run-level names itself (``step``, ``val-core/<env>/acc/mean@1``,
    ``timing_s/step`` without validation, ``timing_s/testing``): the script reads its lines as they are."""
    raw = _raw(DATA / "local" / "gigpo_s0" / "metrics.jsonl")
    rows = lb.run.read_run(DATA / "local" / "gigpo_s0", "local")
    assert rows == raw and [r["step"] for r in rows] == [0, 1, 2]
    for row in rows:
        assert row["val-core/gridnav/acc/mean@1"] == row["val/success_rate"] == lb.run.val_success(row)
        assert row["timing_s/testing"] == row["timing_s/val"]
        if row["step"] > 0:  # verl's step time leaves the validation out
            assert row["timing_s/step"] == pytest.approx(row["timing_s/iteration"] - row["timing_s/val"], abs=0.01)
        else:
            assert "timing_s/step" not in row  # the validation before training is no iteration
    assert lb.run.finished(DATA / "local" / "gigpo_s0", "local", 2)
    assert not lb.run.finished(DATA / "local" / "gigpo_s0", "local", 3)


def test_curves_hold_validation_train_success_and_seconds_per_engine(lb):
    curves = lb.report.load_curves(DATA / "verl", ["gigpo", "grpo"], [0, 1], engine="verl", label="verl/{name}")
    assert list(curves) == ["verl/gigpo"]  # no grpo run and no seed 1: left out
    c = curves["verl/gigpo"]
    raw = [r["data"] for r in _raw(DATA / "verl" / "gigpo_s0" / "ckpt" / "metrics.jsonl")]
    np.testing.assert_array_equal(c["steps"], [0, 1, 2])
    np.testing.assert_array_equal(c["val"], [[r["val-core/gridnav/acc/mean@1"] for r in raw]])
    np.testing.assert_array_equal(c["train"], [[r["env/success_rate"] for r in raw[1:]]])
    assert c["seconds"][0] == pytest.approx(sum(r["timing_s/step"] + r["timing_s/testing"] for r in raw[1:]))
    assert c["seeds"] == [0] and len(c["rows"][0]) == 3


# ---------------------------------------------------------------------------------------------- report
def _section(text: str, heading: str) -> str:
    assert text.count(heading) == 1
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:] if end == -1 else text[start:end]


def _pm(values: list[float]) -> str:
    return f"{np.mean(values):.2f} ± {np.std(values):.2f}"


def test_the_side_by_side_section_and_plot_from_the_recorded_runs(lb, runs, tmp_path, capsys):
    results = tmp_path / "out" / "RESULTS.md"
    results.parent.mkdir()
    results.write_text("# Benchmark results\n\n## Another benchmark\n\nkept as it is\n")
    assert lb.cli.main([*ARGV_VERL, "--runs", str(runs), "--results", str(results), "--report-only"]) == 0
    text = results.read_text()
    assert "## Another benchmark\n\nkept as it is" in text
    section = _section(text, lb.settings.SECTION_VERL)
    assert section in capsys.readouterr().out  # printed as written
    assert (
        f"Command: `python benchmarks/learning.py {ARGV} --opt-steps 1 --runs {runs} --results {results}` " in section
    )
    assert "(tables rebuilt from the kept data or finished runs with `--report-only`)" in section
    # the settings table: 2 tasks x 2 episodes x 10 steps = 40 rows per optimizer step at most on verl
    assert "`trainer.v1.gigpo_sync.mini_batch_rows=40`" in section
    assert "| output tokens (local: no action-token constraint) | `local.constrain_to_actions=false` |" in section

    verl = [r["data"] for r in _raw(DATA / "verl" / "gigpo_s0" / "ckpt" / "metrics.jsonl")]
    local = _raw(DATA / "local" / "gigpo_s0" / "metrics.jsonl")
    for engine, val, train, seconds in (
        (
            "verl",
            [r["val-core/gridnav/acc/mean@1"] for r in verl],
            [r["env/success_rate"] for r in verl[1:]],
            sum(r["timing_s/step"] + r["timing_s/testing"] for r in verl[1:]),
        ),
        (
            "local",
            [r["val/success_rate"] for r in local],
            [r["env/success_rate"] for r in local[1:]],
            sum(r["timing_s/iteration"] for r in local[1:]),
        ),
    ):
        # start, final, mean after the start, train success over the last iteration (2 iterations: a window of 1)
        reached = [s for s, v in zip((0, 1, 2), val, strict=True) if v >= 0.5]
        row = (
            f"| {engine} | gigpo | 1 | {_pm(val[:1])} | {_pm(val[-1:])} | {_pm([np.mean(val[1:])])} | "
            f"{_pm(train[-1:])} | {int(bool(reached))}/1 | {reached[0] if reached else '-'} | 8 | {seconds:.0f} |"
        )  # training episodes: 2 iterations x 2 tasks x 2 (the recordings log no running total)
        assert row in section, row
        assert f"- {engine} gigpo: s0 {val[-1]:.2f}" in section
    iteration = (
        np.mean([r["timing_s/iteration"] - r["timing_s/val"] for r in local[1:]]),
        np.mean([r["timing_s/step"] for r in verl[1:]]),
    )
    assert f"| **training iteration** | **{iteration[0]:.2f}** | **{iteration[1]:.2f}** |" in section
    validation = (np.mean([r["timing_s/val"] for r in local]), np.mean([r["timing_s/testing"] for r in verl[1:]]))
    assert f"| one validation (not in the iteration) | {validation[0]:.2f} | {validation[1]:.2f} |" in section
    launch = json.loads((DATA / "verl" / "gigpo_s0" / "launch.json").read_text())["wall_s"]
    startup = launch - sum(r["timing_s/step"] + r["timing_s/testing"] for r in verl[1:])
    assert f"shutdown): {startup:.0f} s (min {startup:.0f}, max {startup:.0f})." in section
    rows = np.mean([r["update/rows"] for r in verl[1:]])
    steps = np.mean([r["update/num_mini_batches"] for r in verl[1:]])
    assert f"| verl | gigpo | {rows:.0f} | {steps:.2f} |" in section
    assert "![learning curves, verl (solid) and the local engine (dashed)](learning_verl.png)" in section
    assert (results.parent / "learning_verl.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Wall time" not in section  # nothing ran


def test_the_local_benchmark_section_from_a_recorded_run(lb, runs, tmp_path):
    results = tmp_path / "RESULTS.md"
    argv = ["--engine", "local", "--configs", "gigpo", "--seeds", "1", "--iters", "2", "--runs", str(runs / "local")]
    argv += ["--report-only"]
    assert lb.cli.main([*argv, "--results", str(results)]) == 0
    section = _section(results.read_text(), lb.settings.SECTION)
    local = _raw(DATA / "local" / "gigpo_s0" / "metrics.jsonl")
    val = [r["val/success_rate"] for r in local]
    assert f"| gigpo | 1 | {_pm(val[:1])} | {_pm(val[-1:])} | {_pm([np.mean(val[1:])])} |" in section
    assert "![learning curves](learning.png)" in section and (tmp_path / "learning.png").exists()


def test_no_finished_runs_exit_1_and_write_nothing(lb, tmp_path, capsys):
    results = tmp_path / "RESULTS.md"
    argv = [*ARGV_VERL, "--runs", str(tmp_path / "none"), "--results", str(results), "--report-only"]
    assert lb.cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "no kept data under" in err and f"no finished runs under {tmp_path / 'none'}" in err and not results.exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--configs", "gigpo,ppo"], "unknown configs ['ppo']"),
        (["--engine", "verl", "--tasks", "3", "--opt-steps", "2"], "--tasks (3) must be a multiple of --opt-steps (2)"),
        (["--engine", "local", "--task", "goal"], "--task and --opt-steps apply to --engine verl"),
        (["--configs", "gigpo", "--verl-configs", "grpo"], "--verl-configs ['grpo'] are not in --configs ['gigpo']"),
        (["--engine", "verl", "--iters", "0"], "--iters must be >= 1, got 0"),
    ],
)
def test_bad_options_are_refused_by_name(lb, argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        lb.cli.parse_args(argv)
    assert stop.value.code == 2 and message in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- launches
def _compose_verl(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "verl_gigpo" / "config"), version_base=None):
        return compose(config_name="gigpo_trainer", overrides=overrides)


@pytest.mark.parametrize("name", ["gigpo", "grpo"])
def test_the_verl_launch_composes_passes_verls_and_the_entry_points_checks_and_matches_its_twin(
    lb, name, tiny_model_dir, tmp_path
):
    """What ``python -m verl_gigpo.main`` does with the launch's overrides before Ray starts: compose, select the cpu
    platform (its check), preflight (keys, model and task files); verl's own config validation; and the local twin's
    overrides pass the local engine's check with every shared setting equal on both engines."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from verl_gigpo.local.config import load_config
    from verl_gigpo.verl_glue.cpu import check_cpu_config
    from verl_gigpo.verl_glue.preflight import preflight

    args, names = lb.cli.parse_args([*ARGV_VERL, "--model", str(tiny_model_dir), "--runs", str(tmp_path / "runs")])
    assert names == ["gigpo"] and args.credit_freq == 1 and args.micro_batch == 16
    data_dir = lb.run.write_tasks(args)
    run_dir = tmp_path / "runs" / "verl" / f"{name}_s0"
    overrides = lb.settings.verl_overrides(name, 0, args, run_dir, data_dir)
    assert overrides[0] == "platform=cpu"
    cfg = _compose_verl(overrides)
    check_cpu_config(cfg)
    preflight(cfg)  # raises naming every bad key or path
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    assert cfg.algorithm.adv_estimator == name and cfg.trainer.device == "cpu"
    assert OmegaConf.to_container(cfg.env.kwargs) == {"size": 5, "walls": [3, 6], "min_path": 3}
    assert cfg.trainer.default_local_dir == str(run_dir / "ckpt") and cfg.data.train_files.startswith(str(data_dir))
    credit = cfg.trainer.get("credit_log_freq", 0)
    assert credit == (1 if name == "gigpo" else 0)

    twin = load_config(lb.settings.twin_overrides(name, 0, args, tmp_path / "runs" / "local" / f"{name}_s0"))
    same = [s for s in lb.settings.shared_settings(args) if tuple(o.lstrip("+") for o in s.verl) == s.local]
    keys = [o.split("=", 1)[0] for s in same for o in s.local]
    assert len(same) >= 15 and "env.kwargs.walls" in keys and "actor_rollout_ref.actor.optim.lr" in keys
    for key in keys:  # the settings the table states once for both engines hold the same value on both
        assert OmegaConf.select(twin, key) == OmegaConf.select(cfg, key), key
    assert twin.local.constrain_to_actions is False and twin.trainer.seed == 0


def test_every_local_benchmark_run_passes_the_local_engines_check(lb, tmp_path):
    from verl_gigpo.local.config import load_config

    for suite in lb.settings.SUITES:
        args, names = lb.cli.parse_args(["--engine", "local", "--suite", suite, "--runs", str(tmp_path)])
        for name in names:
            cfg = load_config(lb.settings.local_overrides(name, 3, args, tmp_path / f"{name}_s3"))
            assert cfg.trainer.seed == 3 and cfg.trainer.total_training_steps == 150
            assert f"algorithm.adv_estimator={cfg.algorithm.adv_estimator}" in lb.settings.CONFIGS[name]
            assert cfg.env.kwargs.key is True and cfg.env.max_steps == 15


# ------------------------------------------------------------------------- dynamic sampling through verl (report)
def test_the_verl_dynamic_sampling_report_counts_episodes_from_a_recorded_run(lb, runs, tmp_path, capsys):
    """``benchmarks/dynamic_sampling_verl.py --report-only`` on the recorded verl run (no dynamic sampling: each
    iteration played its batch, ``episode/num_trajectories``): validation success against the episodes played up
    to it, the last validation within an episode budget, and the section with its table and plot."""
    import dynamic_sampling_verl as dsv

    raw = _raw(DATA / "verl" / "gigpo_s0" / "ckpt" / "metrics.jsonl")
    played = np.cumsum([0] + [r["data"]["episode/num_trajectories"] for r in raw if r["step"] > 0])
    val = [next(v for k, v in r["data"].items() if k.startswith("val-core/")) for r in raw]
    rows = lb.run.read_run(runs / "verl" / "gigpo_s0", "verl")
    stats = dsv.run_stats(rows, budget=played[1])
    assert stats["curve"][0].tolist() == played.tolist() and stats["curve"][1].tolist() == val
    assert (stats["start"], stats["final"], stats["at_budget"]) == (val[0], val[-1], val[1])
    assert stats["episodes"] == played[-1] and stats["iterations"] == 2
    assert np.isnan(stats["rounds"]) and np.isnan(stats["kept_by_step_signal_only"])  # no dynamic sampling
    assert stats["train_last"] == np.mean([r["data"]["env/success_rate"] for r in raw if r["step"] > 0])
    # with dynamic sampling an iteration counts every round's episodes, and their success (not the kept groups')
    dynamic = {"dynamic/episodes_played": 12, "dynamic/played_success_rate": 0.25, "dynamic/rounds": 3}
    rows = [{**r, **dynamic} if "episode/num_trajectories" in r else r for r in rows]
    stats = dsv.run_stats(rows, budget=12)
    assert stats["curve"][0].tolist() == [0, 12, 24] and stats["at_budget"] == val[1]
    assert (stats["episodes"], stats["train_last"], stats["rounds"]) == (24, 0.25, 3)

    results = tmp_path / "RESULTS.md"
    argv = ["--configs", "gigpo", "--seeds", "1", "--iters", "2", "--test-freq", "1", "--runs", str(runs)]
    assert dsv.main([*argv, "--report-only", "--results", str(results)]) == 0
    text = results.read_text()
    assert dsv.SECTION in text and f"val success at {2 * 4 * 8} episodes" in text
    assert f"| gigpo | 1 | {val[0]:.2f} ± 0.00 | {val[-1]:.2f} ± 0.00 |" in text
    assert f"| gigpo | {val[0]:.2f} → {val[-1]:.2f} |" in text and (tmp_path / dsv.PNG).stat().st_size > 0
    assert dsv.main([*argv, "--report-only", "--runs", str(tmp_path / "none"), "--no-results"]) == 1
    assert "no kept data under" in capsys.readouterr().err


def test_the_verl_dynamic_sampling_benchmark_refuses_bad_options_by_name(lb, capsys):
    import dynamic_sampling_verl as dsv

    for argv, message in (
        (["--configs", "gigpo,ppo"], "--configs: unknown ['ppo']"),
        (["--iters", "0"], "--iters must"),
    ):
        with pytest.raises(SystemExit) as stop:
            dsv.parse_args(argv)
        err = capsys.readouterr().err
        assert stop.value.code == 2 and message in err and "learning.py" not in err, err


def test_verdicts_need_three_paired_seeds(lb):
    """Two seeds whose differences are equal give a zero-width interval: no verdict from them; three seeds decide."""
    base = {"final": {0: 0.25, 1: 0.09, 2: 0.30}, "mean": {0: 0.1, 1: 0.1, 2: 0.1}}
    two = {"final": {0: 0.34, 1: 0.18}, "mean": {0: 0.1, 1: 0.1}}
    three = {"final": {0: 0.35, 1: 0.20, 2: 0.39}, "mean": {0: 0.1, 1: 0.1, 2: 0.1}}
    lines = lb.report.verdicts({"base": base, "two": two, "three": three}, {"two": "base", "three": "base"})
    assert (
        lines[0] == "- `two`, final validation success: too few paired seeds to say (+0.09 [+0.09, +0.09], 2 seed(s))."
    )
    assert lines[2].startswith("- `three`, final validation success: higher than `base` (+0.10 [")
    assert lines[3].startswith("- `three`, validation success averaged over training: no difference shown")
