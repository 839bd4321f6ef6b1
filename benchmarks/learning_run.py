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

from kept_data import KeptDataError, check_args, kept_file, read_kept, write_kept
from learning_settings import (
    IMITATE_MODEL,
    REPO,
    TASKS,
    VERL_METRICS,
    ensure_start_model,
    local_overrides,
    twin_overrides,
    verl_overrides,
)

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


def episodes_per_iteration(row: dict[str, Any]) -> float:
    """Training episodes an iteration played: every round's with dynamic sampling (``dynamic/episodes_played``),
    else the batch's trajectories (``episode/num_trajectories``)."""
    return float(row.get("dynamic/episodes_played", row["episode/num_trajectories"]))


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


def load_run(
    runs: Path, data: Path | None, label: str, seed: int, engine: str, expect: argparse.Namespace | None = None
) -> tuple[list[dict], dict | None]:
    """One (configuration, seed)'s metric rows and verl launch record (``wall_s``, ``returncode``; None for the local
    engine): from its kept file (:func:`kept_data.kept_file` of ``label``) when there is one, else from its run
    folder ``runs/<config>_s<seed>`` (``([], None)`` when neither exists, or when the folder's run has not reached
    ``expect.iters``: a run still training is not reported). A kept file made with other options than ``expect`` is
    refused (:func:`kept_data.check_args`)."""
    kept = kept_file(data, label, seed) if data is not None else None
    if kept is not None and kept.exists():
        header, rows = read_kept(kept)
        if expect is not None:
            check_args(kept, header, expect)
        return rows, header["launch"]
    run_dir = runs / f"{label.rpartition('/')[2]}_s{seed}"
    if expect is not None and not finished(run_dir, engine, expect.iters):
        return [], None
    launch = run_dir / "launch.json"
    return read_run(run_dir, engine), json.loads(launch.read_text()) if launch.exists() else None


def keep(run_dir: Path, engine: str, kept: Path, overrides: list[str], args: argparse.Namespace) -> Path:
    """Write a finished run's kept file (:func:`kept_data.write_kept`): its rows, the launch record beside a verl
    run, the benchmark's arguments and command (``args.command`` when set), the run's overrides."""
    launch = run_dir / "launch.json"
    return write_kept(
        kept,
        read_run(run_dir, engine),
        overrides=overrides,
        args={k: v for k, v in vars(args).items() if k != "command"},
        command=getattr(args, "command", None),
        launch=json.loads(launch.read_text()) if launch.exists() else None,
    )


#: overrides that say where a run writes or reads its files, not what it runs
PLACE_KEYS = ("trainer.default_local_dir=", "data.train_files=", "data.val_files=")


def cell_done(kept: Path, overrides: list[str], args: argparse.Namespace) -> bool:
    """True when a (configuration, seed) cell's kept file exists and ``--rerun`` was not given: the runner skips it.
    A kept file whose run had other overrides (:data:`PLACE_KEYS` aside) is refused, naming both."""
    if not kept.exists() or getattr(args, "rerun", False):
        return False
    header, _ = read_kept(kept)
    old = [o for o in header["overrides"] if not o.startswith(PLACE_KEYS)]
    new = [o for o in overrides if not o.startswith(PLACE_KEYS)]
    if old != new:
        raise KeptDataError(
            f"{kept}: kept from a run with other settings (kept: {[o for o in old if o not in new]}; now: "
            f"{[o for o in new if o not in old]}); pass --rerun to replace it, or --data to keep this experiment "
            "in another folder"
        )
    return True


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


def _train_and_keep(out: Path, overrides: list[str], label: str, kept: Path, args: argparse.Namespace) -> Path:
    """Train one local-engine run into ``out`` unless its cell is done (:func:`cell_done`) or its folder finished
    (``--rerun``: always), then keep its data."""
    if cell_done(kept, overrides, args):
        return out
    if getattr(args, "rerun", False) or not finished(out, "local", args.iters):
        _run_local(overrides, label)
    keep(out, "local", kept, overrides, args)
    return out


def run_one(name: str, seed: int, args: argparse.Namespace) -> Path:
    """Train one (configuration, seed) on the local engine (the local benchmark) and keep its data; returns its run
    directory (skipped when its kept file exists)."""
    out = Path(args.runs) / f"{name}_s{seed}"
    kept = kept_file(args.data, name, seed)
    return _train_and_keep(out, local_overrides(name, seed, args, out), f"{name} seed {seed}", kept, args)


def run_twin(name: str, seed: int, args: argparse.Namespace) -> Path:
    """The local engine's run of one (configuration, seed) with the side-by-side settings, kept as ``local/<name>``
    (skipped when its kept file exists)."""
    out = Path(args.runs) / "local" / f"{name}_s{seed}"
    kept = kept_file(args.data, f"local/{name}", seed)
    return _train_and_keep(out, twin_overrides(name, seed, args, out), f"local {name} seed {seed}", kept, args)


def run_verl(name: str, seed: int, args: argparse.Namespace, data_dir: Path) -> Path:
    """Train one (configuration, seed) through ``python -m verl_gigpo.main platform=cpu`` and keep its data as
    ``verl/<name>``; returns its run directory (skipped when its kept file exists; a finished folder is only kept;
    an unfinished one starts over: verl's file logger appends). Writes ``launch.json`` (``wall_s``, ``returncode``)
    beside the launch's ``train.log``."""
    from verl_gigpo.dev.smoke import run_pipeline

    out = Path(args.runs).resolve() / "verl" / f"{name}_s{seed}"
    kept = kept_file(args.data, f"verl/{name}", seed)
    overrides = verl_overrides(name, seed, args, out, data_dir)
    if cell_done(kept, overrides, args):
        return out
    if getattr(args, "rerun", False) or not finished(out, "verl", args.iters):
        if out.exists():
            shutil.rmtree(out)
        # no copies of the synced weights (the smoke test's check); exit status 124 after --verl-timeout seconds
        launch = run_pipeline(
            f"verl {name} seed {seed}",
            out,
            overrides,
            env={"GIGPO_HF_DUMP_WEIGHTS_DIR": ""},
            timeout=args.verl_timeout,
        )
        record = {"wall_s": launch.seconds, "returncode": launch.returncode}
        (out / "launch.json").write_text(json.dumps(record) + "\n")
        if launch.returncode != 0 or not finished(out, "verl", args.iters):
            raise RuntimeError(f"verl {name} seed {seed} failed (exit {launch.returncode}); see {launch.log}")
    keep(out, "verl", kept, overrides, args)
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
    """verl runs (``--verl-configs`` x ``--verl-seeds``) one after another, the local twins (every configuration
    and seed; those of the verl configurations first) alongside them one at a time (one torch thread), or
    ``--jobs`` at a time when no verl run is asked for; the task files first (:func:`write_tasks`)."""
    data_dir = write_tasks(args)
    verl_names = getattr(args, "verl_names", names)
    verl_jobs = [(n, s) for s in seeds[: getattr(args, "verl_seeds", len(seeds))] for n in verl_names]
    twin_jobs = sorted(((n, s) for s in seeds for n in names), key=lambda j: (j[0] not in verl_names, j[1]))
    twin_jobs = [] if args.no_twin else twin_jobs
    print(f"{len(verl_jobs)} verl runs one at a time, {len(twin_jobs)} local twins beside", flush=True)
    with ThreadPoolExecutor(max_workers=max(2, args.jobs)) as pool:
        if not verl_jobs:
            list(pool.map(lambda job: run_twin(*job, args), twin_jobs))
            return
        twins = pool.submit(lambda: [run_twin(n, s, args) for n, s in twin_jobs])
        verl = pool.submit(lambda: [run_verl(n, s, args, data_dir) for n, s in verl_jobs])
        verl.result()
        twins.result()


def run_benchmark(names: list[str], seeds: list[int], args: argparse.Namespace) -> None:
    """Every run of the benchmark that is not finished yet: ``--engine verl`` side by side (the action-format model
    built when missing), else the local benchmark, ``--jobs`` runs at a time (the tiny model built when missing)."""
    if args.engine == "verl":
        from verl_gigpo.dev.smoke import ensure_model

        if args.model == IMITATE_MODEL:
            ensure_start_model(args.model)  # IMITATE_COMMAND when missing
        else:
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
