"""The learning benchmark's runs (``benchmarks/learning.py``): launching them and reading what they wrote.

A local-engine run is ``python -m verl_gigpo.local.train`` in its own process with one torch thread; a verl run is
``python -m verl_gigpo.main platform=cpu`` launched by the smoke test's launcher
(:func:`verl_gigpo.dev.smoke.run_pipeline`). :func:`read_run` reads either engine's run folder as rows in verl's
run-level names (``step``, ``val-core/<source>/acc/mean@1``, ``timing_s/step``, ``timing_s/testing``), which both
engines write.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from learning_settings import REPO, TASKS, VERL_METRICS, local_overrides, twin_overrides, verl_overrides

#: the data source of the benchmark's tasks (gridnav): verl's validation metric is ``val-core/<source>/acc/mean@1``
VAL_SOURCE = "gridnav"


# ---------------------------------------------------------------------------------------------- reading
def read_run(run_dir: Path, engine: str) -> list[dict[str, Any]]:
    """A run's metric rows, in file order, in verl's run-level names (``step``, ``val-core/<source>/acc/mean@1``,
    ``timing_s/step`` = a training iteration without validation, ``timing_s/testing``) plus every logged key.

    ``engine="local"``: ``run_dir/metrics.jsonl``; ``engine="verl"``: verl's file logger output
    (``run_dir/ckpt/metrics.jsonl``), whose iterations missing or logged twice are reported on stdout.
    """
    if engine == "local":
        path = run_dir / "metrics.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        return [json.loads(x) for x in lines if x.strip()]
    from verl_gigpo.verl_glue.metrics_file import format_steps, iteration_gaps, read_metrics

    rows = read_metrics(run_dir / VERL_METRICS)
    missing, repeated = iteration_gaps(rows)
    if missing or repeated:
        print(
            f"  {run_dir}: iterations missing from its metrics: {format_steps(missing) or 'none'}; logged twice: "
            f"{format_steps(repeated) or 'none'}",
            flush=True,
        )
    return rows


def val_success(row: dict[str, Any]) -> float | None:
    """The validation success of a row (verl's core validation metric: the share of won episodes), or None when
    the row holds no validation."""
    from verl_gigpo.dev.smoke import val_metric

    key = val_metric(row)
    return None if key is None else row[key]


def finished(run_dir: Path, engine: str, iters: int) -> bool:
    """True when the run's metrics hold iteration ``iters`` (verl: with its final validation)."""
    rows = read_run(run_dir, engine)
    if engine == "local":
        return bool(rows) and rows[-1]["step"] == iters
    return any(r["step"] == iters and val_success(r) is not None for r in rows)


# ---------------------------------------------------------------------------------------------- launching
def _run_local(overrides: list[str], label: str) -> None:
    """``python -m verl_gigpo.local.train OVERRIDES`` in a subprocess with one torch thread."""
    cmd = [sys.executable, "-m", "verl_gigpo.local.train", *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{label} failed:\n{done.stderr[-4000:]}")
    print(f"  {label}: {time.perf_counter() - start:.0f} s", flush=True)


def run_one(name: str, seed: int, args: argparse.Namespace) -> Path:
    """Train one (configuration, seed) on the local engine (the local benchmark); returns its run directory
    (skipped when finished)."""
    out = Path(args.runs) / f"{name}_s{seed}"
    if not finished(out, "local", args.iters):
        _run_local(local_overrides(name, seed, args, out), f"{name} seed {seed}")
    return out


def run_twin(name: str, seed: int, args: argparse.Namespace) -> Path:
    """The local engine's run of one (configuration, seed) with the side-by-side settings (skipped when finished)."""
    out = Path(args.runs) / "local" / f"{name}_s{seed}"
    if not finished(out, "local", args.iters):
        _run_local(twin_overrides(name, seed, args, out), f"local {name} seed {seed}")
    return out


def run_verl(name: str, seed: int, args: argparse.Namespace, data_dir: Path) -> Path:
    """Train one (configuration, seed) through ``python -m verl_gigpo.main platform=cpu``; returns its run
    directory (skipped when finished; an unfinished one starts over: verl's file logger appends). Writes
    ``launch.json`` (``wall_s``, ``returncode``) beside the launch's ``train.log``."""
    from verl_gigpo.dev.smoke import run_pipeline

    out = Path(args.runs).resolve() / "verl" / f"{name}_s{seed}"
    if finished(out, "verl", args.iters):
        return out
    if out.exists():
        shutil.rmtree(out)
    # no copies of the synced weights (the smoke test's check); exit status 124 after --verl-timeout seconds
    launch = run_pipeline(
        f"verl {name} seed {seed}",
        out,
        verl_overrides(name, seed, args, out, data_dir),
        env={"GIGPO_HF_DUMP_WEIGHTS_DIR": ""},
        timeout=args.verl_timeout,
    )
    (out / "launch.json").write_text(json.dumps({"wall_s": launch.seconds, "returncode": launch.returncode}) + "\n")
    if launch.returncode != 0 or not finished(out, "verl", args.iters):
        raise RuntimeError(f"verl {name} seed {seed} failed (exit {launch.returncode}); see {launch.log}")
    return out


def write_tasks(args: argparse.Namespace) -> Path:
    """The side-by-side runs' task files under ``--runs``: ``data/train.parquet`` (tasks x iterations tasks of the
    ``--task``'s train split) and ``data/val.parquet`` (``--val-size`` tasks); returns the folder (absolute)."""
    from omegaconf import OmegaConf

    from verl_gigpo.data.prepare import write_task_files

    data_dir = Path(args.runs).resolve() / "data"
    task = OmegaConf.from_dotlist(list(TASKS[args.task]))  # parsed as the local engine parses it
    env_kwargs = OmegaConf.to_container(task.env.kwargs, resolve=True)
    write_task_files(
        task.env.name,
        data_dir,
        train_size=args.tasks * args.iters,
        val_size=args.val_size,
        env_kwargs=env_kwargs,
    )
    return data_dir


def run_side_by_side(names: list[str], seeds: list[int], args: argparse.Namespace) -> None:
    """verl runs one after another; the local twins alongside them, one at a time (one torch thread); the task
    files first (:func:`write_tasks`)."""
    data_dir = write_tasks(args)
    jobs = [(name, seed) for seed in seeds for name in names]
    print(
        f"{len(jobs)} verl runs one at a time" + ("" if args.no_twin else f", {len(jobs)} local twins beside"),
        flush=True,
    )
    with ThreadPoolExecutor(max_workers=2) as pool:
        twins = None if args.no_twin else pool.submit(lambda: [run_twin(n, s, args) for n, s in jobs])
        verl = pool.submit(lambda: [run_verl(n, s, args, data_dir) for n, s in jobs])
        verl.result()
        if twins is not None:
            twins.result()


def run_benchmark(names: list[str], seeds: list[int], args: argparse.Namespace) -> None:
    """Every run of the benchmark that is not finished yet: ``--engine verl`` side by side (the action-format model
    built when missing), else the local benchmark, ``--jobs`` runs at a time (the tiny model built when missing)."""
    if args.engine == "verl":
        from verl_gigpo.dev.smoke import ensure_model

        ensure_model(args.model)  # the action-format model (ACTION_MODEL_COMMAND) when missing
        run_side_by_side(names, seeds, args)
        return
    if not (Path(args.model) / "config.json").exists():
        from verl_gigpo.dev.tiny_model import build_tiny_model

        build_tiny_model(args.model)
    jobs = [(name, seed) for seed in seeds for name in names]
    print(f"{len(jobs)} runs, {args.jobs} at a time", flush=True)
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(lambda job: run_one(job[0], job[1], args), jobs))
