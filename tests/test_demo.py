"""`make demo` in its shortened mode (DEMO_ITERS=2), as a subprocess like make runs it (CPU-only)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent


def test_make_demo_target_runs_the_demo_module():
    out = subprocess.run(["make", "-n", "demo"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert "-m verl_gigpo.dev.demo" in out


def _shortened_demo(model_dir, tmp_path):
    """``make demo`` in its shortened mode (DEMO_ITERS=2, seed 1) into ``tmp_path/run``: ``(run folder, stdout)``."""
    env = {
        **os.environ,
        "DEMO_ITERS": "2",
        "DEMO_SEED": "1",
        "DEMO_OUT": str(tmp_path / "run"),
        "DEMO_MODEL": str(model_dir),  # the session's tiny model (building the full-size one is tested apart)
        "HF_HUB_OFFLINE": "1",
    }
    # a smaller validation set keeps the shortened mode quick; everything else is the demo's configuration
    cmd = [sys.executable, "-m", "verl_gigpo.dev.demo", "data.val_size=16", "local.progress=false"]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return tmp_path / "run", done.stdout


@pytest.fixture(scope="module")
def demo_run(tiny_model_dir, tmp_path_factory):
    """The shortened demo, once for this file: ``(run folder, stdout)``."""
    return _shortened_demo(tiny_model_dir, tmp_path_factory.mktemp("demo"))


@pytest.mark.slow
def test_the_demo_gives_the_same_numbers_on_every_run(demo_run, tiny_model_dir, tmp_path):
    """Every request is seeded (docs/reproducibility.md), so a second demo on this machine logs the same value of
    every metric but the clocks and how the server happened to batch requests (the rollout-vs-update log-prob gap
    moves with the batch's padding by ~1e-7)."""
    again, _ = _shortened_demo(tiny_model_dir, tmp_path)
    timing = ("rollout/batch_size_mean", "rollout/logprob_diff_max")

    def numbers(run):
        return [
            {k: v for k, v in m.items() if not (k.startswith("timing") or "seconds" in k or k in timing)}
            for m in _metrics(run)
        ]

    first, second = numbers(demo_run[0]), numbers(again)
    assert first == second and "val/success_rate" in first[-1] and "actor/entropy" in first[-1]


@pytest.mark.slow
def test_demo_shortened_mode(demo_run):
    run, text = demo_run
    tmp_path = run.parent
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
    # the closing hint works pasted into a fresh shell: another folder, no virtual environment on PATH
    hint = [line for line in text.splitlines() if line.startswith("another iteration or group: ")]
    assert len(hint) == 1, text
    command = hint[0].removeprefix("another iteration or group: ")
    assert command.startswith(f"{sys.executable} -m verl_gigpo.inspect {run} --iter 2 --group ")
    fresh = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=fresh, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"graph: {credit / 'report' / 'credit_graph_iter2_group'}" in done.stdout


def test_the_inspect_hint_names_this_python_and_the_absolute_run_folder(tmp_path, monkeypatch):
    from verl_gigpo.dev.demo import inspect_command

    monkeypatch.chdir(tmp_path)
    assert inspect_command("runs/demo", 3, "g 7") == (
        f"{sys.executable} -m verl_gigpo.inspect {tmp_path / 'runs' / 'demo'} --iter 3 --group 'g 7'"
    )


def test_building_the_bm25_environments_logs_no_debug_lines(caplog):
    """``make demo`` builds its tiny model's tokenizer from every environment's text, webshop's and search's BM25
    indexes included; bm25s sets its logger to DEBUG at import, which printed its indexing chatter."""
    from environments import make_env

    with caplog.at_level(logging.DEBUG):
        make_env("webshop")
        make_env("search")
    assert [r.getMessage() for r in caplog.records if r.name.startswith("bm25s")] == []


def test_demo_start_is_checked_before_anything_is_built(tmp_path, capsys):
    """DEMO_START names one of the two starts (random weights + action constraint, or the imitation model)."""
    from verl_gigpo.dev.demo import START_OVERRIDES, main

    assert set(START_OVERRIDES) == {"random", "imitate"}
    # the imitation start samples over the full vocabulary, with room for the action word, EOS and one spare token
    assert "local.constrain_to_actions=false" in START_OVERRIDES["imitate"][1]
    with pytest.raises(SystemExit) as exit_info:
        main(["--start", "bogus", "--out", str(tmp_path / "run"), "--model", str(tmp_path / "model")])
    assert exit_info.value.code == 2
    assert "--start / DEMO_START must be one of random, imitate, got 'bogus'" in capsys.readouterr().err
    assert not (tmp_path / "model").exists() and not (tmp_path / "run").exists()


def test_the_imitation_start_plays_the_task_its_model_imitates():
    """The imitation start's overrides are the task its model is built on (gridnav with a key, no history)."""
    from verl_gigpo.dev.demo import DEMO_OVERRIDES, IMITATE_TASK, START_ITERS, START_OVERRIDES
    from verl_gigpo.local.config import load_config

    cfg = load_config([*DEMO_OVERRIDES, *START_OVERRIDES["imitate"][1]])
    assert dict(cfg.env.kwargs) == IMITATE_TASK
    assert cfg.env.max_steps == 15 and cfg.env.history_length == 0
    assert START_ITERS == {"random": 200, "imitate": 100}


# ---------------------------------------------------------------------------------------------- evaluation
def _metrics(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_evaluating_the_demo_checkpoint_repeats_its_final_validation(demo_run, tmp_path):
    """`python -m verl_gigpo.evaluate RUN` as a user runs it: the run's last checkpoint, the run's settings, the same
    16 tasks and per-episode seeds as its validation, so the same success rate; then the table, the plot, the
    transcripts and credit records the inspector reads."""
    run, _ = demo_run
    out = tmp_path / "after"
    cmd = [sys.executable, "-m", "verl_gigpo.evaluate", str(run), "--out", str(out), "--quiet"]
    done = subprocess.run(
        cmd, cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    overall = summary["rows"][-1]
    assert overall["name"] == "all" and overall["episodes"] == 16 and overall["tasks"] == 16
    final = _metrics(run)[-1]["val/success_rate"]
    assert overall["rate"] == final and overall["wins"] == round(final * 16)
    assert overall["low"] <= overall["rate"] <= overall["high"] and overall["high"] - overall["low"] > 0.1
    assert summary["episodes_per_task"] == 1 and summary["seed"] == 1 and "iteration 2" in summary["model"]
    assert f"success {overall['wins']}/16" in done.stdout and f"table:       {out / 'table.md'}" in done.stdout
    assert "| **all** | 16 | 16 |" in (out / "table.md").read_text()
    assert (out / "success_by_type.png").stat().st_size > 1000
    from verl_gigpo.credit.records import read_credit_records
    from verl_gigpo.rollout.transcripts import episode_outcomes, read_transcripts

    records = read_transcripts(out / "transcripts")
    assert len(episode_outcomes(records)) == 16 and {r["split"] for r in records} == {"test"}
    credit = read_credit_records(out / "credit" / "iter_0.jsonl")
    assert len(credit) == len(records) and {r["method"] for r in credit} == {"gigpo"}
    # its float32 export carries the run's settings, so the folder evaluates to the same figure
    from verl_gigpo.evaluate import evaluate_local
    from verl_gigpo.export import RUN_SETTINGS, export_checkpoint

    exported = export_checkpoint(run, tmp_path / "exported", dtype="float32")
    assert exported.settings.startswith("local run") and (tmp_path / "exported" / RUN_SETTINGS).is_file()
    again = evaluate_local(tmp_path / "exported", out=tmp_path / "exported-eval", progress=False)
    assert again.overall.rate == overall["rate"]
    assert "saved with the export" in json.loads(again.summary.read_text())["settings_from"]


@pytest.mark.slow
def test_evaluating_the_start_model_with_the_runs_settings_repeats_its_first_validation(
    demo_run, tiny_model_dir, tmp_path
):
    """The model before training (a Hugging Face folder) with --settings RUN: the run's first validation."""
    from verl_gigpo.evaluate.__main__ import main

    run, _ = demo_run
    out = tmp_path / "before"
    assert main([str(tiny_model_dir), "--settings", str(run), "--out", str(out), "--quiet"]) == 0
    overall = json.loads((out / "summary.json").read_text())["rows"][-1]
    assert overall["rate"] == _metrics(run)[0]["val/success_rate"]


@pytest.mark.slow
def test_greedy_decoding_repeats_each_task_and_pass_at_k_counts_tasks(demo_run, tmp_path, caplog):
    """-k 3 --greedy: the three episodes of a task are the same (greedy), so pass@3 equals the success rate, and the
    evaluation warns so; sampled (--temperature 1.5) pass@3 is at least the rate. The table names the decoding."""
    from verl_gigpo.evaluate import EvalOptions, default_out, evaluate_local, resolve_model

    run, _ = demo_run
    assert default_out(resolve_model(run), "test") == Path("runs") / "eval" / f"{run.name}-iter_2-test"
    with caplog.at_level("WARNING", logger="verl_gigpo.evaluate"):
        greedy = evaluate_local(
            run, out=tmp_path / "g", options=EvalOptions(episodes=3, greedy=True, tasks=8), progress=False
        )
    assert "greedy decoding with 3 episodes per task" in caplog.text and "pass@3 = the success rate" in caplog.text
    assert greedy.k == 3 and greedy.overall.episodes == 24 and greedy.overall.tasks == 8
    assert greedy.overall.pass_k == greedy.overall.rate
    head = greedy.table.read_text().splitlines()[:3]
    assert head[2] == "local engine, greedy decoding, restricted to the action words; 3 episode(s) per task; seed 1"
    from verl_gigpo.rollout.transcripts import read_transcripts

    actions: dict = {}
    for r in read_transcripts(greedy.transcripts):
        actions.setdefault((r["group"], r["step"]), set()).add(r["action"])
    assert all(len(a) == 1 for a in actions.values())
    caplog.clear()
    sampled = evaluate_local(
        run, out=tmp_path / "s", options=EvalOptions(episodes=3, temperature=1.5, tasks=8), progress=False
    )
    assert sampled.overall.pass_k >= sampled.overall.rate and "greedy decoding" not in caplog.text
    assert "local engine, sampled (temperature 1.5), restricted" in sampled.table.read_text()


def test_evaluate_refuses_bad_input_with_one_line(tmp_path, capsys, tiny_model_dir):
    from verl_gigpo.evaluate.__main__ import main

    assert main([str(tmp_path / "nothing"), "--out", str(tmp_path / "o1")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty"), "--out", str(tmp_path / "o2")]) == 2
    assert "is not a model the evaluation reads" in capsys.readouterr().err
    verl_ckpt = tmp_path / "exp" / "global_step_3" / "actor"
    verl_ckpt.mkdir(parents=True)
    assert main([str(verl_ckpt), "--out", str(tmp_path / "o3")]) == 2
    assert "actor is not a model the evaluation reads" in capsys.readouterr().err
    assert main([str(tiny_model_dir), "--tasks", "all", "--out", str(tmp_path / "o4")]) == 2
    assert "--tasks all: gridnav split 'test' has no fixed task list" in capsys.readouterr().err
    assert main([str(tiny_model_dir), "env.max_steps=0", "--out", str(tmp_path / "o5")]) == 2
    assert "env.max_steps=0" in capsys.readouterr().err
    assert main([str(tiny_model_dir), "--settings", str(tmp_path / "nope"), "--out", str(tmp_path / "o6")]) == 2
    assert f"--settings {tmp_path / 'nope'} does not exist" in capsys.readouterr().err
    assert main([str(tiny_model_dir), "--settings", str(tmp_path / "empty"), "--out", str(tmp_path / "o7")]) == 2
    assert "not a local-engine run or checkpoint, nor a verl experiment" in capsys.readouterr().err
    assert not (tmp_path / "o6").exists() and not (tmp_path / "o7").exists()
    assert (
        main([str(tiny_model_dir), "--tasks", "2", "env.max_steps=3", "--out", str(tmp_path / "o10"), "--quiet"]) == 0
    )
    assert json.loads((tmp_path / "o10" / "summary.json").read_text())["config"]["env"]["max_steps"] == 3
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["env.max_steps=3", str(tiny_model_dir)])
    assert "the model comes first" in capsys.readouterr().err
    assert main([str(tiny_model_dir), "--out", str(REPO / "README.md" / "x")]) == 2
    assert "cannot make the output folder" in capsys.readouterr().err
    weightless = tmp_path / "weightless"
    weightless.mkdir()
    (weightless / "config.json").write_text("{}")
    assert main([str(weightless), "--out", str(tmp_path / "o11")]) == 2
    assert "has config.json but no weights" in capsys.readouterr().err
    assert main([str(tiny_model_dir), "--device", "tpu", "--out", str(tmp_path / "o8")]) == 2
    assert "trainer.device=tpu (--device): not a device; use cpu, cuda or cuda:N" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main([str(tiny_model_dir), "--device", "cuda", "--out", str(tmp_path / "o9")]) == 2
        assert "trainer.device=cuda (--device) but torch sees no CUDA device" in capsys.readouterr().err
    assert not (tmp_path / "o8").exists() and not (tmp_path / "o9").exists()
    for argv, message in (
        (["--tasks", "0"], "--tasks 0"),
        (["--temperature", "0"], "use --greedy"),
        (["--greedy", "--temperature", "1"], "not allowed with argument"),
        (["max_steps"], "'max_steps' is not key=value"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main([str(tiny_model_dir), *argv])
        assert exit_info.value.code == 2 and message in capsys.readouterr().err
