"""The CPU demo's figures (README, docs/local-engine.md), from runs whose data are kept in the repository.

    python benchmarks/demo_runs.py                          # both starts, seeds 0-2; skips kept (start, seed) cells
    python benchmarks/demo_runs.py --starts random --seeds 0 --rerun
    python benchmarks/demo_runs.py --report-only            # the section from benchmarks/data/demo/ alone

Each cell is one ``python -m verl_gigpo.dev.demo --start START --seed SEED --out runs/demo-bench/START-seedSEED``
(what ``make demo`` runs; the start model is built where the demo builds it when missing). Its metrics go to
``benchmarks/data/demo/START-seedSEED.jsonl.gz`` as soon as it finishes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kept_data import KeptDataError, kept_file, read_kept, shown, write_kept  # noqa: E402
from results_md import add_output_options, emit_section  # noqa: E402

HEADING = "## The CPU demo (`make demo`)"
STARTS = ("random", "imitate")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (module docstring); bad values are refused by name."""
    parser = argparse.ArgumentParser(description="The CPU demo's figures, from kept runs")
    parser.add_argument("--starts", nargs="+", default=list(STARTS), choices=STARTS, help="demo starts to run")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="seeds (DEMO_SEED) to run")
    parser.add_argument("--runs", default="runs/demo-bench", help="where the demo runs go (not committed)")
    parser.add_argument("--data", default="benchmarks/data/demo", help="the kept-data folder (committed)")
    parser.add_argument("--rerun", action="store_true", help="run cells that already have kept data again")
    add_output_options(parser)
    args = parser.parse_args(argv)
    if any(s < 0 for s in args.seeds):
        parser.error(f"--seeds must be >= 0, got {args.seeds}")
    return args


def run_cell(start: str, seed: int, args: argparse.Namespace) -> Path:
    """Run one demo and keep its metrics; return the kept file."""
    out = Path(args.runs) / f"{start}-seed{seed}"
    cmd = [sys.executable, "-m", "verl_gigpo.dev.demo", "--start", start, "--seed", str(seed), "--out", str(out)]
    began = time.perf_counter()
    done = subprocess.run(cmd, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"error: the demo {start} seed {seed} failed (exit {done.returncode}): {done.stderr[-2000:]}")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    launch = {"wall_s": round(time.perf_counter() - began, 1), "returncode": 0}
    command = " ".join(["python", "-m", "verl_gigpo.dev.demo", *cmd[3:]])
    return write_kept(
        kept_file(args.data, start, seed),
        rows,
        overrides=[],
        args={"start": start, "seed": seed},
        command=command,
        launch=launch,
    )


def _wins(rate: float, episodes: int) -> str:
    """``rate`` as ``wins/episodes (rate)``."""
    return f"{round(rate * episodes)}/{episodes} ({rate:.3f})"


def report(args: argparse.Namespace) -> str:
    """The RESULTS.md section from every kept file under ``args.data``."""
    files = sorted(Path(args.data).glob("*-seed*.jsonl.gz"))
    if not files:
        raise KeptDataError(f"no kept data under {args.data}: run `python benchmarks/demo_runs.py` first")
    lines = [
        HEADING,
        "",
        "`make demo` (`random`: random weights, decoding restricted to the four action words, gridnav, 10 steps,",
        "200 iterations) and `DEMO_START=imitate make demo` (`imitate`: a model that imitates the expert 70 % of the",
        "time, full-vocabulary sampling, gridnav with a key, 15 steps, 100 iterations); validation on 64 tasks. Every",
        "request is seeded (docs/reproducibility.md), so a rerun on one machine gives the same figures",
        "(tests/test_demo.py). The figures changed when seeded sampling replaced the per-episode generators: `random`",
        "seed 0 read 0.062 → 0.688 before, `imitate` seed 0 0.219 → 0.641. Wall seconds are as measured, on a",
        "machine that other jobs may have shared.",
        "",
        f"Command: `python benchmarks/demo_runs.py`. Kept data: `{shown(args.data)}/`.",
        "",
        "| start | seed | validation success before → after (wins/episodes) | iterations | wall s | commit |",
        "|---|---|---|---|---|---|",
    ]
    for path in files:
        header, rows = read_kept(path)
        vals = [r for r in rows if "val/success_rate" in r]
        episodes = int(vals[0].get("val/num_trajectories", 0))
        first, last = vals[0]["val/success_rate"], vals[-1]["val/success_rate"]
        iters = int(max(r.get("training_step", 0) for r in rows))
        wall = (header.get("launch") or {}).get("wall_s", "-")
        lines.append(
            f"| {header['args']['start']} | {header['args']['seed']} | {_wins(first, episodes)} → "
            f"{_wins(last, episodes)} | {iters} | {wall} | {header['commit'][:10]} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (module docstring)."""
    args = parse_args(argv)
    if not args.report_only:
        for start in args.starts:
            for seed in args.seeds:
                path = kept_file(args.data, start, seed)
                if path.exists() and not args.rerun:
                    print(f"{start} seed {seed}: kept ({shown(path)}), skipped")
                    continue
                print(f"{start} seed {seed}: running ...", flush=True)
                print(f"  kept: {shown(run_cell(start, seed, args))}", flush=True)
    return emit_section(lambda: report(args), HEADING, args)


if __name__ == "__main__":
    sys.exit(main())
