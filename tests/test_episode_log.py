"""Whole episodes where users look (``trainer.log_episodes``) and the end-of-launch summary, on the local engine with a
tiny real model and the real gridnav environment (CPU-only): episodes.jsonl, episodes.html, tensorboard text and a
wandb table (offline), the same validation tasks every time, advantage terms of training episodes, cut texts."""

from __future__ import annotations

import json

import numpy as np
import pytest

from verl_gigpo.local.cli import main
from verl_gigpo.local.train import load_config
from verl_gigpo.rollout.episode_log import (
    CUT_MARKER,
    EpisodeLogOptions,
    PartWriter,
    drain_parts,
    logger_names,
    training_records,
)
from verl_gigpo.rollout.step_rows import StepBatch
from verl_gigpo.rollout.summary import health_lines, launch_summary, validation_lines

EASY = ["env.kwargs.size=3", "env.kwargs.walls=0", "env.kwargs.min_path=1", "env.max_steps=4"]


def _read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_local_run_logs_episodes_to_file_html_tensorboard_wandb_and_ends_with_a_summary(
    tiny_model_dir, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "tb"))
    (tmp_path / "wandb").mkdir()
    out = tmp_path / "run"
    args = [f"actor_rollout_ref.model.path={tiny_model_dir}", f"trainer.default_local_dir={out}",
            "trainer.total_training_steps=2", "trainer.test_freq=1", "data.train_batch_size=3",
            "actor_rollout_ref.rollout.n=2", "data.val_size=3", "actor_rollout_ref.rollout.val_kwargs.n=2",
            "local.progress=false", "local.plot=false", "trainer.log_episodes=2", "trainer.log_episodes_train_freq=2",
            "trainer.log_episodes_max_chars=20", "trainer.logger=[tensorboard,wandb]", *EASY]  # fmt: skip
    assert main(args) == 0
    printed = capsys.readouterr().out

    records = _read(out / "episodes.jsonl")
    val = [r for r in records if r["kind"] == "val"]
    train = [r for r in records if r["kind"] == "train"]
    # every validation (before training, after iterations 1 and 2) logs member 0 of tasks 0 and 1
    assert [(r["iteration"], r["seed"]) for r in val] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    # training episodes at iteration 2 only (freq 2): the first trajectory of the first two groups, with both terms
    assert [r["iteration"] for r in train] == [2, 2] and len({r["traj"] for r in train}) == 2
    for record in records:
        assert record["outcome"] in ("won", "lost") and record["length"] == len(record["steps"]) >= 1
        assert sum(s["reward"] for s in record["steps"]) == pytest.approx(record["episode_return"])
        assert record["num_invalid"] == sum(not s["valid"] for s in record["steps"])
        for step in record["steps"]:  # texts over 20 characters are cut there, with the marker
            text = step["observation"]
            assert len(text) <= 20 or (text.endswith(CUT_MARKER) and len(text) == 20 + len(CUT_MARKER))
    assert sum(s["observation"].endswith(CUT_MARKER) for r in records for s in r["steps"]) > 0
    assert all("reply" in s and s["reply"] for r in val for s in r["steps"])
    steps = [s for r in train for s in r["steps"]]
    assert all({"episode_adv", "step_adv", "advantage"} <= set(s) for s in steps)
    assert any(abs(s["episode_adv"]) > 0 for s in steps)
    for s in steps:
        assert s["advantage"] == pytest.approx(s["episode_adv"] + s["step_adv"])  # w = 1

    page = (out / "episodes.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "http://" not in page and "https://" not in page
    assert page.count("<details") == len(records) and "val: task0" in page and "val: task1" in page
    assert "A_E " in page and "A_S " in page

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"tensors": 0})
    events.Reload()
    tags = events.Tags()["tensors"]
    assert {"episodes/val/task0/text_summary", "episodes/val/task1/text_summary"} <= set(tags)
    text = events.Tensors("episodes/val/task0/text_summary")
    assert [t.step for t in text] == [0, 1, 2]
    assert "| step | observation |" in text[-1].tensor_proto.string_val[0].decode()
    assert "env/success_rate" in events.Tags()["scalars"]  # the metrics went to tensorboard through verl's Tracking

    tables = list((tmp_path / "wandb").rglob("episodes/val_*.table.json"))
    assert len(tables) == 3  # one per validation
    table = json.loads(tables[0].read_text())
    assert table["columns"][:5] == ["iteration", "task", "task_type", "outcome", "step"]
    assert {row[1] for row in table["data"]} == {"task0", "task1"}
    assert list((tmp_path / "wandb").rglob("episodes/train_*.table.json"))

    history = _read(out / "metrics.jsonl")
    last = history[-1]
    won = round(last["val/success_rate"] * 6)
    summary = printed[printed.index("=== run summary ===") :].splitlines()
    assert summary[1] == "iterations done: 2"
    assert summary[2].startswith(f"last validation (iteration 2): all {won}/6")
    assert summary[3] == "health alarms: none (no health.jsonl in the run folder)"
    assert summary[4] == f"checkpoint: {out / 'checkpoints' / 'iter_2'}"
    assert summary[5] == f"evaluate: python -m verl_gigpo.evaluate {out}"
    assert summary[6].split() == ["export:", "python", "-m", "verl_gigpo.export", str(out), "--out", "exported/run"]


def test_options_name_the_key():
    with pytest.raises(ValueError, match="trainer.log_episodes=-1"):
        EpisodeLogOptions.from_trainer({"log_episodes": -1})
    with pytest.raises(ValueError, match="trainer.log_episodes_train_freq"):
        EpisodeLogOptions.from_trainer({"log_episodes_train_freq": 1.5})
    options = EpisodeLogOptions.from_trainer({"log_episodes": 2, "log_episodes_train_freq": 3})
    assert [options.train_due(k) for k in range(7)] == [False, False, False, True, False, False, True]
    assert not EpisodeLogOptions.from_trainer({"log_episodes_train_freq": 3}).train_due(3)  # N = 0: off
    # trainer.logger: a name or a list (verl takes both); a name verl does not know fails before anything is built
    assert logger_names("wandb") == ["wandb"] and logger_names(["console", "file"]) == ["console", "file"]
    with pytest.raises(ValueError, match="trainer.logger has 'tensorbord'"):
        load_config(["trainer.logger=[tensorbord]"])


def test_training_records_of_an_outcome_estimator_carry_its_advantage():
    steps = StepBatch(
        group_ids=np.array(["g0", "g0", "g0", "g1", "g1", "g2"], dtype=object),
        traj_ids=np.array(["a", "a", "b", "c", "d", "e"], dtype=object),
        step_ids=np.array([1, 0, 0, 0, 0, 0]),
        anchor_keys=np.array(["s1", "s0", "s0", "s0", "s0", "s0"], dtype=object),
        step_rewards=np.array([1.0, -0.1, 0.0, 0.0, 0.0, 0.0]),
        action_valid=np.array([True, False, True, True, True, True]),
        won=np.array([True, True, False, False, False, False]),
        env_error=np.array([False, False, False, True, False, False]),  # c's environment failed
        task_types=np.array(["pick"] * 6, dtype=object),
        history_dropped=np.zeros(6, dtype=np.int64),
        row_mask=np.array([True, True, True, False, True, True]),
        observations=np.array(["o1", "o0", "o0", "x", "x", "y"], dtype=object),
        actions=np.array(["up", "junk", "up", "up", "up", "up"], dtype=object),
    )
    records = training_records(steps, n=2, iteration=5, max_chars=50, advantages=np.array([0.7, 0.7, -0.7, 0, 0, 0]))
    # the first trajectory of the first two groups, the first whose environment did not fail
    assert [r["traj"] for r in records] == ["a", "d"]
    first = records[0]
    assert [s["step"] for s in first["steps"]] == [0, 1]  # by step id, not by row
    assert [s["action"] for s in first["steps"]] == ["junk", "up"] and [s["valid"] for s in first["steps"]] == [
        False,
        True,
    ]
    assert first["outcome"] == "won" and first["num_invalid"] == 1 and first["episode_return"] == pytest.approx(0.9)
    assert [s["advantage"] for s in first["steps"]] == [0.7, 0.7] and "episode_adv" not in first["steps"][0]


def test_parts_written_by_agent_loops_are_gathered_once(tmp_path):
    writer = PartWriter(tmp_path)
    writer.write({"kind": "val", "iteration": 3, "seed": 1, "traj": "u1_0", "steps": []})
    writer.write({"kind": "val", "iteration": 3, "seed": 0, "traj": "u0_0", "steps": []})
    assert [r["seed"] for r in drain_parts(tmp_path)] == [0, 1]
    assert drain_parts(tmp_path) == []
    writer.write({"kind": "val", "iteration": 4, "seed": 0, "traj": "u2_0", "steps": []})
    assert [r["iteration"] for r in drain_parts(tmp_path)] == [4]


def test_summary_reads_counts_per_type_and_a_tolerant_health_file(tmp_path):
    row = {
        "step": 30.0,
        "val-core/alfworld/pick/success": 0.3,
        "val-core/alfworld/pick/count": 10.0,
        "val-core/alfworld/clean/success": 0.5,
        "val-core/alfworld/clean/count": 4.0,
        "val-core/alfworld/acc/mean@1": 5 / 14,
    }
    assert validation_lines(row) == ["all 5/14", "clean 2/4", "pick 3/10"]
    assert validation_lines({"val-core/webshop/acc/mean@1": 0.25}) == ["val-core/webshop/acc/mean@1 0.250"]
    assert health_lines(tmp_path) == ["none (no health.jsonl in the run folder)"]
    (tmp_path / "health.jsonl").write_text(
        json.dumps({"iteration": 12, "signal": "entropy", "message": "entropy collapsed: try a lower lr"})
        + "\nnot json\n\n"
    )
    assert health_lines(tmp_path) == ["iteration 12: entropy collapsed: try a lower lr", "not json"]
    lines = launch_summary(
        [{"step": 0.0}, row], run_dir=tmp_path, iterations=30, checkpoint=tmp_path / "global_step_30"
    )
    assert lines[2] == "last validation (iteration 30): all 5/14, clean 2/4, pick 3/10"
    assert lines[3:6] == ["health alarms:", "  iteration 12: entropy collapsed: try a lower lr", "  not json"]
    assert lines[-2] == f"evaluate: python -m verl_gigpo.evaluate {tmp_path / 'global_step_30'}"
    assert launch_summary([], run_dir=tmp_path / "x", iterations=None, checkpoint=None)[1:] == [
        "iterations done: unknown",
        "last validation: none",
        "health alarms: none (no health.jsonl in the run folder)",
        "checkpoint: none written",
    ]
    checked = launch_summary(
        [{"step": 1.0, "health/alarms": 0.0}], run_dir=tmp_path / "x", iterations=1, checkpoint=None
    )
    assert checked[3] == "health alarms: none (no health.jsonl in the run folder)"
    unchecked = launch_summary(
        [{"step": 1.0, "timing_s/step": 1.0}], run_dir=tmp_path / "x", iterations=1, checkpoint=None
    )
    assert unchecked[3] == "health alarms: not checked (no health/* metrics logged: trainer.health.enable=false)"
    val_only = launch_summary(
        [{"step": 4.0, "timing_s/testing": 1.0}], run_dir=tmp_path / "x", iterations=None, checkpoint=None
    )
    assert val_only[3] == "health alarms: none (no health.jsonl in the run folder)"  # no iteration to check


def test_a_verl_launch_summary_reads_the_metrics_file_and_the_checkpoint_folder(tmp_path):
    from verl_gigpo.verl_glue.launch import POINTER, LaunchPlan, summary_lines

    (tmp_path / "global_step_2").mkdir()
    (tmp_path / "global_step_3").mkdir()  # a save that did not finish: the pointer names step 2
    (tmp_path / POINTER).write_text("2")
    metrics = tmp_path / "metrics.jsonl"
    rows = [
        {"step": 0, "data": {"val-core/gridnav/acc/mean@1": 0.25}},
        {"step": 1, "data": {"training/global_step": 1, "env/success_rate": 0.5, "health/alarms": 0.0}},
        {"step": 2, "data": {"training/global_step": 2, "val-core/gridnav/acc/mean@1": 0.5}},
    ]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    plan = LaunchPlan(folder=tmp_path, resume_step=0, metrics=metrics, record=None, messages=[])
    lines = summary_lines(plan)
    assert lines[1:4] == [
        "iterations done: 2",
        "last validation (iteration 2): val-core/gridnav/acc/mean@1 0.500",
        "health alarms: none (no health.jsonl in the run folder)",
    ]
    assert lines[4] == f"checkpoint: {tmp_path / 'global_step_2'}"
    assert lines[6].split()[-1] == f"exported/{tmp_path.name}"
    no_file = LaunchPlan(folder=tmp_path / "new", resume_step=0, metrics=None, record=None, messages=[])
    assert summary_lines(no_file)[1:] == [
        "iterations done: unknown",
        "last validation: none",
        "health alarms: none (no health.jsonl in the run folder)",
        "checkpoint: none written",
    ]


def test_transfer_queues_thread_warning_is_shown_once_per_process():
    """TransferQueue warns on every put and get where TQ_NUM_THREADS exceeds the physical cores (a CPU run): the
    plug-in's filter (installed when verl is imported) lets the first through and drops the repeats."""
    import logging

    import psutil
    import verl  # noqa: F401  - loads the plug-in, which installs the filter
    from transfer_queue.utils.common import limit_pytorch_auto_parallel_threads

    from verl_gigpo.verl_glue.quiet import OncePerProcess, quiet_repeated_warnings

    tq_logger = logging.getLogger("transfer_queue.utils.common")
    quiet_repeated_warnings()  # again: still one filter
    assert sum(isinstance(f, OncePerProcess) for f in tq_logger.filters) == 1
    [once] = [f for f in tq_logger.filters if isinstance(f, OncePerProcess)]
    once._seen = False  # as in a fresh process (an earlier test of this one may have shown it)
    seen: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: seen.append(record.getMessage())
    tq_logger.addHandler(handler)
    try:
        for _ in range(3):
            with limit_pytorch_auto_parallel_threads(target_num_threads=psutil.cpu_count(logical=False) + 1):
                pass
        tq_logger.warning("another warning")
    finally:
        tq_logger.removeHandler(handler)
    shown = [m for m in seen if "should not exceed total physical CPU cores" in m]
    assert len(shown) == 1 and "another warning" in seen


def test_a_cpu_launch_passes_transfer_queues_threads_to_every_ray_process(monkeypatch):
    """On fewer than 8 physical cores TransferQueue clamps TQ_NUM_THREADS (8) to them with a warning on every put and
    get, also in its storage actors, which never import verl (so the plug-in's filter is not there): a CPU launch
    passes the core count in Ray's runtime env, unless the user set TQ_NUM_THREADS."""
    import psutil
    from omegaconf import OmegaConf

    from verl_gigpo.verl_glue.cpu import set_transfer_queue_threads

    key = "ray_kwargs.ray_init.runtime_env.env_vars.TQ_NUM_THREADS"
    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: 2)
    config = OmegaConf.create({"ray_kwargs": {"ray_init": {"runtime_env": {"env_vars": {"VERL_PLATFORM": "cpu"}}}}})
    OmegaConf.set_struct(config, True)
    assert set_transfer_queue_threads(config, environ={}) == "2" and OmegaConf.select(config, key) == "2"
    assert set_transfer_queue_threads(OmegaConf.create({}), environ={"TQ_NUM_THREADS": "4"}) is None
    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: 16)
    bare = OmegaConf.create({})
    assert set_transfer_queue_threads(bare, environ={}) is None and OmegaConf.select(bare, key) is None
