"""Where the time goes in verl's own pipeline on a CPU, per iteration and per launch, before and after the `cpu`
platform's speed settings.

    python benchmarks/bench_verl_cpu.py                          # both configurations, before and after (~30-45 min)
    python benchmarks/bench_verl_cpu.py --config learning --settings after --no-results   # one launch, printed
    python benchmarks/bench_verl_cpu.py --config learning --settings after trainer.v1.gigpo_sync.logprob_check_freq=1
    python benchmarks/bench_verl_cpu.py --report-only            # rebuild the tables from the last run (--out)
    python benchmarks/bench_verl_cpu.py --from runs/e2e          # per-iteration table of the runs `make e2e` left

Two configurations, each launched with ``python -m verl_gigpo.main platform=cpu``:

* ``learning``: the launch of ``python benchmarks/learning.py --engine verl`` (its ``verl_overrides`` and default
  settings: gridnav without a key, 4 tasks x 8 episodes = ~310 step rows, 3-token replies, KL off, 4 optimizer
  steps), GiGPO, ``--iters`` iterations, validation before and after;
* ``smoke``: the launches of ``make e2e`` (GiGPO stopped by a killed agent-loop worker mid-iteration 3, a launch
  refused before Ray, the resume, GRPO stopped by a killed rollout server mid-iteration 2;
  :func:`verl_gigpo.dev.smoke.run_smoke`; KL loss on, so the reference pass runs).

Two settings: ``after`` is ``platform=cpu`` as it is; ``before`` adds :data:`BEFORE`, verl's own values of the
settings the platform sets for speed. They run back to back (before first), so both see the same machine load.

Per training iteration: verl's ``timing_s/*`` (rollout ``gen``, old log-probs, reference, advantages, update,
weight sync, checkpoint; the rest of ``timing_s/step`` is Ray calls, TransferQueue and balancing). Per launch:
its start-up phases from :mod:`verl_gigpo.dev.timeline` (``GIGPO_TIMELINE``: each process's start and imports,
Ray start, TransferQueue, worker processes, model loads, rollout servers, validation, shutdown), and the CPU-seconds
of every process of the launch (sampled with psutil every 0.5 s).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results_md import write_section  # noqa: E402

from verl_gigpo.dev.smoke import (  # noqa: E402
    DEFAULT_MODEL,
    RunResult,
    check_runs,
    ensure_model,
    run_pipeline,
    run_smoke,
)
from verl_gigpo.dev.timeline import read_timeline  # noqa: E402
from verl_gigpo.verl_glue.metrics_file import METRICS_NAME, read_metrics  # noqa: E402

HEADING = "## verl's pipeline on CPU: seconds per phase"
#: verl's own values of what ``platform=cpu`` sets for speed (verl_gigpo/config/platform/cpu.yaml)
BEFORE: tuple[str, ...] = (
    "actor_rollout_ref.actor.use_dynamic_bsz=false",  # fixed micro-batches (the *_micro_batch_size_per_gpu)
    "trainer.v1.sampler.poll_interval=null",  # the ReplayBuffer's 2 s
    "ray_kwargs.ray_init.include_dashboard=null",  # Ray's default: the dashboard starts
    "reward.num_workers=1",  # a reward-loop worker process
    "algorithm.rollout_correction.bypass_mode=false",  # the actor's old-log-prob pass every iteration
)
SETTINGS = {"before": BEFORE, "after": ()}
#: the hand-written reading printed under the tables (true of the measured runs; re-read it after changes)
READING = (
    "Reading (before and after back to back on a 2-core machine with little other work, load 1-3; an earlier set",
    "under a load of 2-5 measured 16.1 s before, so absolute numbers move with the load more than the ratios):",
    "",
    "- **Learning configuration: 12.6 → 5.5 s per iteration (2.3x).** The actor update 6.0 → 2.4 s (rows of similar",
    "  length share a padded micro-batch, and micro-batches carry only the fields a pass reads); the old-log-prob pass",
    "  2.4 → 0.23 s (bypass mode: the rollout's log-probs are the old ones; the actor's pass ran on iteration 1 only,",
    "  1.1 s, the launch's check, and 0.05-0.4 s of TransferQueue copies elsewhere); the rollout 3.8 → 2.5 s, which",
    "  loses the ReplayBuffer's 2-s rounding (before: 2.0 or 4.0 s in every iteration) but keeps 2-3 s of Python in",
    "  the agent-loop worker, the `hf` server and verl's load balancer, which no verl setting changes.",
    "- **The same numbers**: the rollout server's and the actor's token probabilities agree to <= 8.9e-7 wherever",
    "  they are compared (`training/rollout_probs_diff_max`: every iteration before, the launch's first one after),",
    "  so the sorted micro-batches give every row its own log-prob back and the rollout's log-probs stand in for the",
    "  actor's.",
    "- **Smoke configuration: 7.1 → 5.2 s per iteration**; ~1.1-1.3 s of each are Ray and TransferQueue calls that",
    "  the settings do not touch, the reference pass still runs (KL loss on), and the first iteration of a launch",
    "  is the slowest (up to 12 s).",
    "- **Start-up + shutdown: 44-68 s per launch, 3-6 s less after.** Ten processes start one after another, and each",
    "  spends ~5 s starting Python and importing torch and verl before its work. The platform starts fewer of them",
    "  (no Ray dashboard: 10 processes; no reward-loop worker), which shows in the CPU-seconds until the first",
    "  iteration (learning 80 → 65, smoke 60 → 52) more than in the wall time. The rest: TransferQueue 8-9 s, model",
    "  loads and the first weight sync ~6 s, the validation before training 1-9 s, shutdown ~5 s.",
    "- Not attributed: inside `Ray start`, how the seconds split among GCS, raylet and prestarted workers; inside",
    "  a process's start, how much is waiting for a core rather than importing (the CPU-seconds table gives the CPU",
    "  part); inside `fit`, what is neither an iteration nor a validation (logging, metrics).",
)
PHASES = (
    ("gen", "rollout (agent loops, `gen`)"),
    ("old_log_prob", "old log-probs (actor)"),
    ("ref", "reference log-probs"),
    ("adv", "advantages (trainer mode)"),
    ("update_actor", "actor update"),
    ("update_weights", "weight sync to the rollout server"),
    ("save_checkpoint", "checkpoint"),
)


# ---------------------------------------------------------------------------------------------- per iteration
def _mean(values: list[float]) -> str:
    return f"{statistics.mean(values):.2f}" if values else "–"


def iteration_table(columns: dict[str, list[dict]]) -> list[str]:
    """Markdown rows: mean seconds per training iteration and phase, one column per set of runs' metric rows."""
    rows = {name: [m for m in metrics if "timing_s/step" in m] for name, metrics in columns.items()}
    for name, found in rows.items():
        if not found:
            raise ValueError(f"{name}: no training iteration with timing_s/step in the metrics")
    lines = ["| phase | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    accounted = {name: [0.0] * len(found) for name, found in rows.items()}
    for key, label in PHASES:
        cells = []
        for name, found in rows.items():
            values = [m.get(f"timing_s/{key}", 0.0) for m in found]
            accounted[name] = [a + v for a, v in zip(accounted[name], values, strict=True)]
            cells.append(_mean(values))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
        if key == "gen":
            for sub, sub_label in (("env_seconds_mean", "environment"), ("generate_seconds_mean", "server")):
                cells = [
                    _mean([m[f"episode/{sub}"] for m in found if f"episode/{sub}" in m]) for found in rows.values()
                ]
                lines.append(f"| &nbsp;&nbsp;per trajectory: {sub_label} | " + " | ".join(cells) + " |")
    rest = [
        _mean([m["timing_s/step"] - a for m, a in zip(found, accounted[n], strict=True)]) for n, found in rows.items()
    ]
    lines.append("| rest: Ray calls, TransferQueue, balancing | " + " | ".join(rest) + " |")
    steps = [[m["timing_s/step"] for m in found] for found in rows.values()]
    lines.append(
        "| **iteration (`timing_s/step`)** | "
        + " | ".join(f"**{statistics.mean(s):.2f}** ({min(s):.2f}-{max(s):.2f})" for s in steps)
        + " |"
    )
    lines.append("| iterations measured | " + " | ".join(str(len(s)) for s in steps) + " |")
    gaps = [
        [m["training/rollout_probs_diff_max"] for m in found if "training/rollout_probs_diff_max" in m]
        for found in rows.values()
    ]
    lines.append(
        "| largest \\|p_rollout − p_actor\\| of a token (`training/rollout_probs_diff_max`) | "
        + " | ".join(f"{max(g):.1e}" if g else "–" for g in gaps)
        + " |"
    )
    return lines


# ---------------------------------------------------------------------------------------------- per launch
class ProcessSampler(threading.Thread):
    """Every ``interval`` seconds: CPU-seconds, name and creation time of every descendant of this process."""

    def __init__(self, interval: float = 0.5):
        super().__init__(daemon=True)
        self.interval = interval
        self.procs: dict[int, dict[str, Any]] = {}
        self._stop_event = threading.Event()

    def run(self) -> None:
        me = psutil.Process()
        while not self._stop_event.is_set():
            for proc in me.children(recursive=True):
                try:
                    with proc.oneshot():
                        cpu = proc.cpu_times()
                        entry = self.procs.setdefault(proc.pid, {"created": proc.create_time(), "names": []})
                        name = " ".join(proc.cmdline()[:3]) or proc.name()
                        if not entry["names"] or entry["names"][-1] != name:
                            entry["names"].append(name)
                        entry["cpu"] = cpu.user + cpu.system
                        entry.setdefault("series", []).append((time.time(), entry["cpu"]))
                except psutil.Error:
                    continue
            self._stop_event.wait(self.interval)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


def process_role(names: list[str]) -> str:
    """A process's role from the command lines / Ray titles it had: ``driver``, a Ray actor's class (the longest
    title seen, titles can be cut short), a Ray service, or the program's name."""
    if any("verl_gigpo.main" in n for n in names):
        return "driver"
    actors = [n.split()[0][5:].split(".")[0].rsplit(":", 1)[-1] for n in names if n.startswith("ray::")]
    actors = [a for a in actors if a != "IDLE"]
    if actors:
        return max(actors, key=len)
    if any(n.startswith("ray::IDLE") for n in names):
        return "Ray worker (started, never used)"
    name = names[-1]
    for key, role in (
        ("gcs_server", "Ray GCS"),
        ("raylet", "Ray raylet"),
        ("dashboard", "Ray dashboard"),
        ("log_monitor", "Ray log monitor"),
        ("monitor.py", "Ray monitor"),
    ):
        if key in name:
            return role
    return Path(name.split()[0]).name


#: the start-up phases of a launch: (label, from, to); a point is ("launch", "start" | "end"), (span label, edge)
#: of a verl_gigpo/dev/timeline.py record (the first call; "validation" also counts the last), or ("process",
#: role, edge): the first process of that role, "start" = created, "end" = its imports reached verl's plug-ins
STARTUP: tuple[tuple[str, tuple[str, str], tuple[str, str]], ...] = (
    ("driver: Python start, imports (Hydra, torch, verl)", ("launch", "start"), ("process:driver", "end")),
    ("driver: platform, config checks, main_ppo import", ("process:driver", "end"), ("ray_init", "start")),
    ("Ray start (GCS, raylet, dashboard, first workers)", ("ray_init", "start"), ("ray_init", "end")),
    ("TaskRunner: process start, imports", ("ray_init", "end"), ("process:TaskRunnerV1", "end")),
    (
        "TaskRunner: config print, until TransferQueue",
        ("process:TaskRunnerV1", "end"),
        ("transfer_queue_init", "start"),
    ),
    (
        "TransferQueue: controller and storage processes",
        ("transfer_queue_init", "start"),
        ("transfer_queue_init", "end"),
    ),
    (
        "trainer: tokenizer, datasets, resource pools",
        ("transfer_queue_init", "end"),
        ("actor_worker_processes", "start"),
    ),
    ("actor/ref worker: process start, imports", ("actor_worker_processes", "start"), ("process:WorkerDict", "end")),
    ("actor/ref worker: model load, FSDP wrap", ("process:WorkerDict", "end"), ("reward_workers", "start")),
    (
        "rollout server (`hf`): process start, imports",
        ("reward_workers", "start"),
        ("process:HFGenerationServer", "end"),
    ),
    ("rollout server: model load; weight-sync setup", ("process:HFGenerationServer", "end"), ("trainer_init", "end")),
    (
        "agent-loop worker, load balancer: process starts, imports",
        ("trainer_init", "end"),
        ("process:AgentLoopWorkerTQ", "end"),
    ),
    (
        "validation before training (after the agent-loop worker is up)",
        ("process:AgentLoopWorkerTQ", "end"),
        ("pre_validation", "end"),
    ),
    ("training iterations and later validations (`fit`)", ("pre_validation", "end"), ("fit", "end")),
    ("TransferQueue close, Ray shutdown, exit", ("fit", "end"), ("launch", "end")),
)


def startup_phases(run: RunResult, roles: dict[int, str]) -> dict[str, float]:
    """Seconds of each :data:`STARTUP` phase of one launch, from its timeline; ``roles`` maps pids to process roles
    (:func:`process_role`). A phase whose points are missing (e.g. a launch without validation) is left out."""
    records = read_timeline(run.timeline) if run.timeline and run.timeline.exists() else []
    points: dict[tuple[str, str], float] = {
        ("launch", "start"): run.started,
        ("launch", "end"): run.started + run.seconds,
    }
    for r in records:
        key = f"process:{roles.get(r['pid'], '?')}" if r["label"] == "process" else r["label"]
        for edge in ("start", "end"):
            points.setdefault((key, edge), r[edge])
    # the validation before training, if any, starts as the fit does; without one (a resumed launch) it takes 0 s
    fit_start = points.get(("fit", "start"))
    before = [r for r in records if r["label"] == "validation" and fit_start and r["start"] - fit_start < 5]
    worker_up = points.get(("process:AgentLoopWorkerTQ", "end"))
    if before or worker_up is not None:
        points[("pre_validation", "end")] = before[0]["end"] if before else worker_up
    return {
        label: points[b] - points[a]
        for label, a, b in STARTUP
        if a in points and b in points and points[b] >= points[a]
    }


def import_seconds(run: RunResult, roles: dict[int, str]) -> dict[str, float]:
    """Per process role of one launch: seconds from the process's creation until its imports reached verl's
    plug-in loading (the timeline's ``process`` records)."""
    records = read_timeline(run.timeline) if run.timeline and run.timeline.exists() else []
    return {roles.get(r["pid"], "?"): r["end"] - r["start"] for r in records if r["label"] == "process"}


def startup_table(columns: dict[str, list[RunResult]], roles: dict[int, str]) -> list[str]:
    """Markdown: seconds per start-up phase (mean over the column's launches), one column per set of launches."""
    per_column = {name: [startup_phases(r, roles) for r in runs] for name, runs in columns.items()}
    labels = list(dict.fromkeys(k for phases in per_column.values() for p in phases for k in p))
    lines = ["| phase (seconds per launch) | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for label in labels:
        cells = [_mean([p[label] for p in phases if label in p]) for phases in per_column.values()]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    walls = [statistics.mean(r.seconds for r in runs) for runs in columns.values()]
    lines.append("| **launch wall time** | " + " | ".join(f"**{w:.1f}**" for w in walls) + " |")
    steps = [
        statistics.mean(sum(m.get("timing_s/step", 0.0) for m in r.metrics) for r in runs) for runs in columns.values()
    ]
    tests = [
        statistics.mean(sum(m.get("timing_s/testing", 0.0) for m in r.metrics) for r in runs)
        for runs in columns.values()
    ]
    lines.append("| of which training iterations (`timing_s/step`) | " + " | ".join(f"{x:.1f}" for x in steps) + " |")
    lines.append("| of which validations (`timing_s/testing`) | " + " | ".join(f"{x:.1f}" for x in tests) + " |")
    rest = [w - a - b for w, a, b in zip(walls, steps, tests, strict=True)]
    lines.append("| **start-up + shutdown** (the rest) | " + " | ".join(f"**{x:.1f}**" for x in rest) + " |")
    imports = {name: [import_seconds(r, roles) for r in runs] for name, runs in columns.items()}
    found = list(dict.fromkeys(k for per in imports.values() for d in per for k in d))
    for role in found:
        cells = [_mean([d[role] for d in per if role in d]) for per in imports.values()]
        lines.append(f"| process start until verl imported: {role} | " + " | ".join(cells) + " |")
    return lines


def process_table(columns: dict[str, list[RunResult]], sampler: ProcessSampler) -> list[str]:
    """Markdown: CPU-seconds per process role of a launch (mean over the column's launches), until the first training
    iteration starts (after the validation before training) and in all."""
    # each process belongs to the last launch started before it (psutil's creation times can be ~1 s early)
    starts = sorted(r.started for runs in columns.values() for r in runs)

    def launch_of(created: float) -> float | None:
        return max((t for t in starts if t - 1.5 <= created), default=None)

    per_column: dict[str, dict[str, list[float]]] = {}
    for name, runs in columns.items():
        sums: dict[str, list[float]] = {}
        for run in runs:
            records = read_timeline(run.timeline) if run.timeline else []
            # start-up ends when the first training iteration starts: after the validation before training, if any
            marks = [r["end"] for r in records if r["label"] == "validation"][:1] or [
                r["start"] for r in records if r["label"] == "fit"
            ]
            fit_start = marks[0] if marks else run.started + run.seconds
            launch: dict[str, list[float]] = {}
            for proc in sampler.procs.values():
                if launch_of(proc["created"]) != run.started:
                    continue
                role = process_role(proc["names"])
                before = max((c for t, c in proc["series"] if t <= fit_start), default=0.0)
                totals = launch.setdefault(role, [0.0, 0.0, 0])
                totals[0] += before
                totals[1] += proc["cpu"]
                totals[2] += 1
            for role, (before, total, count) in launch.items():
                sums.setdefault(role, []).append((before, total, count))
        per_column[name] = sums
    roles = sorted(
        {r for sums in per_column.values() for r in sums},
        key=lambda r: (
            -max(statistics.mean(t for _, t, _ in v) for s in per_column.values() for k, v in s.items() if k == r)
        ),
    )
    lines = [
        "| process (count) | " + " | ".join(f"{c}: CPU-s until training / in all" for c in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for role in roles:
        cells = []
        for sums in per_column.values():
            v = sums.get(role)
            cells.append(
                f"{statistics.mean(b for b, _, _ in v):.1f} / {statistics.mean(t for _, t, _ in v):.1f} "
                f"({max(n for _, _, n in v)})"
                if v
                else "–"
            )
        lines.append(f"| {role} | " + " | ".join(cells) + " |")
    totals = []
    for sums in per_column.values():
        runs_count = max((len(v) for v in sums.values()), default=1)
        b = sum(sum(x for x, _, _ in v) for v in sums.values()) / runs_count
        t = sum(sum(y for _, y, _ in v) for v in sums.values()) / runs_count
        totals.append(f"**{b:.0f} / {t:.0f}**")
    lines.append("| **all processes** | " + " | ".join(totals) + " |")
    return lines


# ---------------------------------------------------------------------------------------------- launches
def learning_launch(out: Path, model: Path, iters: int, label: str, overrides: tuple[str, ...]) -> RunResult:
    """One launch of ``benchmarks/learning.py --engine verl``'s configuration (GiGPO, seed 0), ``iters`` iterations."""
    import learning_settings as learning
    from learning_run import write_tasks

    args = SimpleNamespace(**learning.ENGINE_DEFAULTS["verl"])
    args.model, args.iters, args.test_freq, args.credit_freq, args.extra = str(model), iters, iters, 0, []
    args.val_size, args.runs = 64, str(out)
    data_dir = write_tasks(args)  # out/data
    run_dir = out / label
    cmd = [*learning.verl_overrides("gigpo", 0, args, run_dir, data_dir), *overrides]
    return run_pipeline(label, run_dir, cmd, env={"GIGPO_HF_DUMP_WEIGHTS_DIR": ""}, timeline=True)


def _load() -> str:
    return ", ".join(f"{x:.1f}" for x in psutil.getloadavg())


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", choices=("both", "learning", "smoke"), default="both")
    parser.add_argument("--settings", choices=("both", "before", "after"), default="both")
    parser.add_argument("--iters", type=int, default=8, help="learning configuration: iterations (default 8)")
    parser.add_argument("--from", dest="source", default=None, help="only tabulate the runs of a smoke output folder")
    parser.add_argument("--out", default="runs/bench-verl-cpu", help="where the launches run (emptied first)")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--no-results", action="store_true", help="do not write benchmarks/RESULTS.md")
    parser.add_argument("extra", nargs="*", help="overrides added to every launch (then RESULTS.md is not written)")
    parser.add_argument(
        "--report-only", action="store_true", help="rebuild the tables from the last run's --out/bench.json"
    )
    args = parser.parse_args(argv)
    if args.iters < 1:
        parser.error(f"--iters must be >= 1, got {args.iters}")
    if args.source:
        # each run folder's experiment metrics: the iterations of all its launches, each once
        files = sorted(Path(args.source).glob(f"*/ckpt/{METRICS_NAME}"))
        if not files:
            parser.error(f"{args.source} holds no */ckpt/{METRICS_NAME} (run `make e2e` or drop --from)")
        rows = [m for f in files for m in read_metrics(f)]
        print("\n".join(iteration_table({args.source: rows})))
        return 0
    out = Path(args.out).resolve()
    if args.report_only:
        launches, sampler, loads, iters = _load_report(out / "bench.json")
        args.iters = iters
        return _publish(markdown(launches, sampler, args, loads), args, complete=len(launches) == 4)
    if out.exists():
        import shutil

        shutil.rmtree(out)
    model = ensure_model(args.model).resolve()
    settings = ["before", "after"] if args.settings == "both" else [args.settings]
    configs = ["learning", "smoke"] if args.config == "both" else [args.config]
    sampler = ProcessSampler()
    sampler.start()
    launches: dict[str, list[RunResult]] = {}
    loads = []
    for config in configs:
        for setting in settings:
            name = f"{config}, {setting}"
            loads.append(f"{name}: {_load()}")
            overrides = (*SETTINGS[setting], *args.extra)
            if config == "learning":
                runs = [learning_launch(out / "learning", model, args.iters, setting, overrides)]
            else:
                runs = list(run_smoke(out / f"smoke-{setting}", model, extra=overrides, timeline=True).values())
            if config == "learning":
                problems = [f"{r.name}: exit {r.returncode}" for r in runs if r.returncode != 0]
            else:  # the smoke kills processes and refuses a launch on purpose: its own checks say what went wrong
                problems = check_runs({r.name: r for r in runs}, model)
            if problems:
                print(f"{name}: " + "; ".join(problems) + " (see the launches' train.log)")
                return 1
            launches[name] = runs
    sampler.stop()
    _save_report(out / "bench.json", launches, sampler, loads, args.iters)
    complete = args.config == "both" and args.settings == "both" and not args.extra
    return _publish(markdown(launches, sampler, args, loads), args, complete=complete)


def _publish(text: str, args: argparse.Namespace, *, complete: bool) -> int:
    print(text)
    if complete and not args.no_results:
        write_section(text, HEADING)
        print("written: benchmarks/RESULTS.md")
    elif not args.no_results:
        print("(RESULTS.md is written only by a run of both configurations and both settings)")
    return 0


def _save_report(
    path: Path, launches: dict[str, list[RunResult]], sampler: ProcessSampler, loads: list[str], iters: int
) -> None:
    runs = {
        name: [
            {
                "name": r.name,
                "run_dir": str(r.run_dir),
                "returncode": r.returncode,
                "seconds": r.seconds,
                "started": r.started,
                "timeline": str(r.timeline) if r.timeline else None,
                "metrics": r.metrics,  # the rows this launch logged (its experiment's file holds every launch's)
            }
            for r in found
        ]
        for name, found in launches.items()
    }
    path.write_text(json.dumps({"launches": runs, "procs": sampler.procs, "loads": loads, "iters": iters}))


def _load_report(path: Path) -> tuple[dict[str, list[RunResult]], ProcessSampler, list[str], int]:
    if not path.exists():
        raise SystemExit(f"{path} does not exist: run the benchmark first (without --report-only)")
    data = json.loads(path.read_text())
    launches = {
        name: [
            RunResult(
                r["name"],
                Path(r["run_dir"]),
                r["returncode"],
                r["seconds"],
                r["metrics"],
                started=r["started"],
                timeline=Path(r["timeline"]) if r["timeline"] else None,
            )
            for r in found
        ]
        for name, found in data["launches"].items()
    }
    sampler = ProcessSampler()
    sampler.procs = {int(pid): proc for pid, proc in data["procs"].items()}
    return launches, sampler, data["loads"], data["iters"]


def markdown(
    launches: dict[str, list[RunResult]], sampler: ProcessSampler, args: argparse.Namespace, loads: list[str]
) -> str:
    """The RESULTS.md section."""
    lines = [
        HEADING,
        "",
        "`python benchmarks/bench_verl_cpu.py` — `python -m verl_gigpo.main platform=cpu` on this machine "
        f"({platform.machine()}, {psutil.cpu_count()} cores, shared with other work while measured; load average at "
        "the start of each set: " + "; ".join(loads) + "). **after**: `platform=cpu` as it is; **before**: the same "
        "with verl's own values of the settings the platform sets for speed (`" + " ".join(BEFORE) + "`). The two "
        "ran back to back, before first."
        + (f" Every launch also had `{' '.join(args.extra)}`." if getattr(args, "extra", None) else ""),
        "",
    ]
    learning = {k: v for k, v in launches.items() if k.startswith("learning")}
    smoke = {k: v for k, v in launches.items() if k.startswith("smoke")}
    if learning:
        lines += [
            f"Per training iteration, the learning configuration (the launch of `python benchmarks/learning.py "
            f"--engine verl`: gridnav without a key, 4 tasks x 8 episodes = ~310 step rows, 3-token replies, KL off, "
            f"4 optimizer steps; GiGPO, {args.iters} iterations):",
            "",
            *iteration_table({k: [m for r in v for m in r.metrics] for k, v in learning.items()}),
            "",
        ]
    if smoke:
        lines += [
            "Per training iteration, the smoke configuration (the launches of `make e2e`: gridnav, 4 tasks x 4 "
            "episodes, <= 6 steps, KL loss on, so the reference pass runs):",
            "",
            *iteration_table({k: [m for r in v for m in r.metrics] for k, v in smoke.items()}),
            "",
        ]
    lines += [
        "Per launch: seconds per phase (means over the launches of each set; from the processes' own timestamps, "
        "`GIGPO_TIMELINE`, verl_gigpo/dev/timeline.py):",
        "",
        *startup_table(launches, {int(pid): process_role(p["names"]) for pid, p in sampler.procs.items()}),
        "",
        "CPU-seconds per process of a launch (psutil, every 0.5 s; until training = until the first training "
        "iteration starts, after the validation before training; the count is processes of that role):",
        "",
        *process_table(launches, sampler),
        "",
        *READING,
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
