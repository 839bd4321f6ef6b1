"""Where the time goes in verl's own pipeline on a CPU (the runs of ``make e2e``), per iteration and per launch.

    python benchmarks/bench_verl_cpu.py                      # runs the smoke test into runs/bench-verl-cpu
    python benchmarks/bench_verl_cpu.py --from runs/e2e      # reads the runs `make e2e` left there
    python benchmarks/bench_verl_cpu.py --no-results         # print only

Per training iteration (verl's ``timing_s/*``): the rollout phase (``gen``: agent loops playing the episodes,
with the seconds each trajectory spent in its environment and awaiting the rollout server, from the agent loop's
``episode/*_seconds_mean``), old-log-prob, reference log-prob, advantages, actor update, weight sync, checkpoint,
and what is left of ``timing_s/step`` (Ray calls, TransferQueue reads/writes, batch balancing). Per launch: wall
time, the sum of the iterations and validations, and the rest: process start-up (Python + torch + verl imports in
every Ray process), Ray and TransferQueue initialisation, model loading, shutdown.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results_md import write_section  # noqa: E402

from verl_gigpo.cpu.smoke import DEFAULT_MODEL, RunResult, check_runs, run_smoke  # noqa: E402
from verl_gigpo.metrics_file import METRICS_NAME, read_metrics  # noqa: E402

HEADING = "## verl's pipeline on CPU: seconds per phase"
#: the hand-written reading printed under the tables (true of the measured runs; re-read it after changes)
READING = (
    "Reading: `gen` is verl's wait for the batch, and verl's ReplayBuffer polls every 2 s, so it reads 2.0 s",
    "whenever the rollout takes less (it does: a trajectory spends ~0.9 s awaiting the `hf` server, the gridnav",
    "environment ~0 s). The FSDP passes (old/reference log-probs, the update: ~5 s) and the rest (Ray calls,",
    "TransferQueue, balancing: ~1.7 s) dominate an iteration; a launch spends 55-76 s starting and stopping its ~10",
    "processes (each imports torch and verl) before and after its 12-18 s of training.",
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


def iteration_table(runs: dict[str, list[dict]]) -> list[str]:
    """Markdown rows: mean seconds per training iteration and phase, over the runs' iterations."""
    rows = [m for metrics in runs.values() for m in metrics if "timing_s/step" in m]
    if not rows:
        raise ValueError("no training iteration with timing_s/step in the metrics")
    lines = ["| phase | seconds per iteration (mean, min-max) |", "|---|---|"]
    accounted = [0.0] * len(rows)
    for key, label in PHASES:
        values = [m.get(f"timing_s/{key}", 0.0) for m in rows]
        accounted = [a + v for a, v in zip(accounted, values, strict=True)]
        lines.append(f"| {label} | {statistics.mean(values):.2f} ({min(values):.2f}-{max(values):.2f}) |")
        if key == "gen":
            for sub, sub_label in (("env_seconds_mean", "environment"), ("generate_seconds_mean", "server")):
                sub_values = [m[f"episode/{sub}"] for m in rows if f"episode/{sub}" in m]
                if sub_values:
                    lines.append(
                        f"| &nbsp;&nbsp;of which per trajectory: {sub_label} | {statistics.mean(sub_values):.2f} |"
                    )
    steps = [m["timing_s/step"] for m in rows]
    rest = [s - a for s, a in zip(steps, accounted, strict=True)]
    lines.append(f"| rest: Ray calls, TransferQueue, balancing | {statistics.mean(rest):.2f} |")
    lines.append(
        f"| **iteration (`timing_s/step`)** | **{statistics.mean(steps):.2f}** ({min(steps):.2f}-{max(steps):.2f}) |"
    )
    return lines


def launch_table(results: dict[str, RunResult]) -> list[str]:
    """Markdown rows: per launch, wall seconds vs the seconds inside iterations and validations."""
    lines = ["| launch | wall s | iterations s | validations s | start-up + shutdown s |", "|---|---|---|---|---|"]
    for name, run in results.items():
        inside = sum(m.get("timing_s/step", 0.0) for m in run.metrics)
        testing = sum(m.get("timing_s/testing", 0.0) for m in run.metrics)
        lines.append(
            f"| {name} | {run.seconds:.0f} | {inside:.0f} | {testing:.0f} | {run.seconds - inside - testing:.0f} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--from", dest="source", default=None, help="read the runs of a smoke output folder")
    parser.add_argument("--out", default="runs/bench-verl-cpu", help="where to run the smoke test")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--no-results", action="store_true", help="do not write benchmarks/RESULTS.md")
    args = parser.parse_args(argv)
    if args.source:
        source = Path(args.source)
        # each run folder's experiment metrics: the iterations of all its launches, each once
        files = sorted(source.glob(f"*/ckpt/{METRICS_NAME}"))
        metrics = {path.parent.parent.name: read_metrics(path) for path in files}
        if not metrics:
            parser.error(f"{source} holds no */ckpt/{METRICS_NAME} (run `make e2e` or drop --from)")
        launches: list[str] = ["(wall times are known only when this script runs the launches itself)"]
        command = f"python benchmarks/bench_verl_cpu.py --from {args.source}"
    else:
        start = time.perf_counter()
        results = run_smoke(args.out, args.model)
        print(f"smoke runs: {time.perf_counter() - start:.0f} s")
        problems = check_runs(results, Path(args.model))
        if problems:
            print("the smoke runs failed (see their train.log):\n  - " + "\n  - ".join(problems))
            return 1
        metrics = {name: run.metrics for name, run in results.items()}
        launches = launch_table(results)
        command = "python benchmarks/bench_verl_cpu.py"
    text = "\n".join(
        [
            HEADING,
            "",
            f"`{command}` — the launches of `make e2e` (GiGPO iterations 1-2 killed after the step-2 checkpoint, a",
            "launch refused before Ray, the resumed iterations 3-4, GRPO iterations 1-2) on gridnav: 4 tasks x 4",
            "episodes, <= 6 steps, 1M-parameter Qwen2, one FSDP rank, the `hf` rollout backend. Machine: "
            f"{platform.machine()}, 2 cores (shared with other work while measured).",
            "",
            "Per training iteration:",
            "",
            *iteration_table(metrics),
            "",
            "Per launch of `python -m verl_gigpo.main`:",
            "",
            *launches,
            "",
            *READING,
            "",
        ]
    )
    print(text)
    if not args.no_results:
        write_section(text, HEADING)
    return 0


if __name__ == "__main__":
    sys.exit(main())
