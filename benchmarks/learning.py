"""Learning benchmark: GiGPO vs GRPO vs RLOO (and a sweep of GiGPO's step weight w and norm) on gridnav.

    python benchmarks/learning.py                          # the full benchmark (see --help; ~60-90 min on 2 cores)
    python benchmarks/learning.py --seeds 2 --iters 20     # a quick look
    python benchmarks/learning.py --report-only            # rebuild the table and plot from finished runs

Every configuration trains the same tiny model (built once, ``--model``) on the same task with the same seeds,
the same rollout budget (tasks x group size per iteration) and the same optimiser settings; only the advantage
estimator differs. Each run is ``python -m verl_gigpo.local.train`` in its own process with one torch thread;
``--jobs`` of them run side by side (more total throughput than one run on two threads).

The task (``TASK``): 5x5 gridnav with a key (``observe=target``: the observation gives the offset to the key
until it is held, then to the goal), where the goal is a locked door until the agent has stepped on the key:
longer horizons than the demo (shortest solutions of 5+ steps, 15-step limit), a sub-goal whose pay-off comes
later, and many states revisited across a group — where step-level credit should matter. About 1-2% of random
episodes succeed, so the reward is sparse.

Outputs: ``benchmarks/learning.png`` (validation success, mean and spread over seeds, per configuration) and the
section "## Learning: GiGPO vs GRPO" of ``benchmarks/RESULTS.md`` (replaced in place; other sections are kept),
with the exact command. Runs go to ``--runs`` (default ``runs/learning``), one folder per (config, seed).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from results_md import write_section  # benchmarks/ is on sys.path when this runs as a script

REPO = Path(__file__).resolve().parent.parent
SECTION = "## Learning: GiGPO vs GRPO"

#: The benchmark task (env overrides shared by every configuration).
TASK: tuple[str, ...] = (
    "env.name=gridnav",
    "env.kwargs.key=true",
    "env.kwargs.observe=target",
    "env.kwargs.size=5",
    "env.kwargs.walls=[2,4]",
    "env.kwargs.min_path=5",
    "env.max_steps=15",
)

#: name -> overrides. gigpo = the paper's setting (w = 1, mean_std, trajectory statistics, state anchors).
CONFIGS: dict[str, tuple[str, ...]] = {
    "gigpo": ("algorithm.adv_estimator=gigpo",),
    "gigpo_w0.5": ("algorithm.adv_estimator=gigpo", "algorithm.gigpo.step_advantage_w=0.5"),
    "gigpo_w0": ("algorithm.adv_estimator=gigpo", "algorithm.gigpo.step_advantage_w=0.0"),
    "gigpo_mean": ("algorithm.adv_estimator=gigpo", "algorithm.gigpo.norm=mean"),
    "grpo": ("algorithm.adv_estimator=grpo",),
    "rloo": ("algorithm.adv_estimator=rloo",),
}


def run_one(name: str, seed: int, args: argparse.Namespace) -> Path:
    """Train one (configuration, seed) in a subprocess; returns its run directory (skipped when finished)."""
    out = Path(args.runs) / f"{name}_s{seed}"
    metrics = out / "metrics.jsonl"
    if metrics.exists() and _done(metrics, args.iters):
        return out
    cmd = [
        sys.executable,
        "-m",
        "verl_gigpo.local.train",
        f"actor_rollout_ref.model.path={args.model}",
        f"trainer.default_local_dir={out}",
        "trainer.overwrite=true",  # an unfinished run (killed, or another config) starts over
        f"trainer.total_training_steps={args.iters}",
        f"trainer.test_freq={args.test_freq}",
        f"trainer.save_freq={args.iters}",
        f"trainer.seed={seed}",
        f"data.val_size={args.val_size}",
        "local.num_threads=1",
        "local.progress=false",
        "local.plot=false",
        *TASK,
        *CONFIGS[name],
        *args.extra,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{name} seed {seed} failed:\n{done.stderr[-4000:]}")
    print(f"  {name} seed {seed}: {time.perf_counter() - start:.0f} s", flush=True)
    return out


def _done(metrics: Path, iters: int) -> bool:
    lines = metrics.read_text().splitlines()
    return bool(lines) and json.loads(lines[-1]).get("training_step") == float(iters)


def load_curves(runs: Path, names: list[str], seeds: list[int]) -> dict[str, dict[str, np.ndarray]]:
    """Per configuration: ``steps`` (V,), ``val`` (S, V) validation success, ``train`` (S, T) train success,
    ``seconds`` (S,) summed iteration time."""
    out = {}
    for name in names:
        vals, trains, secs, steps = [], [], [], None
        for seed in seeds:
            path = runs / f"{name}_s{seed}" / "metrics.jsonl"
            if not path.exists():
                continue
            lines = [json.loads(x) for x in path.read_text().splitlines()]
            val = [m for m in lines if "val/success_rate" in m]
            steps = np.array([m["training_step"] for m in val])
            vals.append([m["val/success_rate"] for m in val])
            trains.append([m["env/success_rate"] for m in lines if "env/success_rate" in m])
            secs.append(sum(m.get("timing_s/iteration", 0.0) for m in lines))
        if vals:
            width = min(len(v) for v in vals)
            out[name] = {
                "steps": steps[:width],
                "val": np.array([v[:width] for v in vals]),
                "train": np.array([t[: min(len(t) for t in trains)] for t in trains]),
                "seconds": np.array(secs),
            }
    return out


def first_reach(steps: np.ndarray, curve: np.ndarray, threshold: float) -> float:
    """First validation step whose success is >= threshold (nan when never)."""
    hit = np.flatnonzero(curve >= threshold)
    return float(steps[hit[0]]) if hit.size else float("nan")


def summarise(curves: dict, threshold: float) -> list[dict]:
    """One row per configuration: final / best / mean-over-curve validation success and iterations to threshold."""
    rows = []
    for name, c in curves.items():
        val = c["val"]  # (S, V)
        reach = np.array([first_reach(c["steps"], v, threshold) for v in val])
        rows.append(
            {
                "name": name,
                "seeds": val.shape[0],
                "start": (val[:, 0].mean(), val[:, 0].std()),
                "final": (val[:, -1].mean(), val[:, -1].std()),
                "auc": (val[:, 1:].mean(axis=1).mean(), val[:, 1:].mean(axis=1).std()),
                "train_last": (c["train"][:, -20:].mean(axis=1).mean(), c["train"][:, -20:].mean(axis=1).std()),
                "reached": int(np.isfinite(reach).sum()),
                "reach_median": float(np.nanmedian(reach)) if np.isfinite(reach).any() else float("nan"),
                "seconds": c["seconds"].mean(),
            }
        )
    return rows


def plot(curves: dict, path: Path, threshold: float, title: str) -> None:
    """Validation success (mean line, min-max band over seeds) and smoothed train success per configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, c in curves.items():
        mean = c["val"].mean(axis=0)
        (line,) = ax1.plot(c["steps"], mean, "o-", ms=3, label=f"{name} (n={c['val'].shape[0]})")
        ax1.fill_between(c["steps"], c["val"].min(axis=0), c["val"].max(axis=0), color=line.get_color(), alpha=0.12)
        train = c["train"].mean(axis=0)
        window = max(1, len(train) // 15)
        smooth = np.convolve(train, np.ones(window) / window, mode="valid")
        ax2.plot(np.arange(window, len(train) + 1), smooth, color=line.get_color(), label=name)
    ax1.axhline(threshold, color="grey", lw=0.8, ls=":")
    ax1.set(xlabel="iteration", ylabel="validation success (sampled)", title=title, ylim=(-0.02, 1.02))
    ax2.set(xlabel="iteration", ylabel=f"train success ({window}-iteration mean)", ylim=(-0.02, 1.02))
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(rows: list[dict], args: argparse.Namespace, command: str, wall: float | None, load: str) -> str:
    """The RESULTS.md section."""

    def pm(x):
        return f"{x[0]:.2f} ± {x[1]:.2f}"

    lines = [
        SECTION,
        "",
        f"Command: `{command}`",
        "",
        f"Task: gridnav with a key ({' '.join(o for o in TASK if o.startswith('env.'))}); tiny model "
        f"`{args.model}`; {args.iters} iterations x (8 tasks x 8 episodes); validation on {args.val_size} fixed "
        f"test-split tasks every {args.test_freq} iterations (sampled, temperature 1); seeds "
        f"{', '.join(str(s) for s in range(args.seeds))}. Mean ± std over seeds (population std, ddof 0); "
        f"'reaching' = some validation point at or above the threshold.",
        "",
        f"| config | seeds | val success at start | final val success | mean val success over training | "
        f"train success, last 20 it. | seeds reaching {args.threshold:.2f} | median it. to {args.threshold:.2f} | "
        "s per run |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        reach = "-" if np.isnan(r["reach_median"]) else f"{r['reach_median']:.0f}"
        lines.append(
            f"| {r['name']} | {r['seeds']} | {pm(r['start'])} | {pm(r['final'])} | {pm(r['auc'])} | "
            f"{pm(r['train_last'])} | {r['reached']}/{r['seeds']} | {reach} | {r['seconds']:.0f} |"
        )
    lines += ["", "![learning curves](learning.png)", ""]
    if wall is not None:
        lines.append(f"Wall time of the whole benchmark: {wall / 60:.0f} min ({args.jobs} runs in parallel). {load}")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=150)
    parser.add_argument("--test-freq", type=int, default=15)
    parser.add_argument("--val-size", type=int, default=64)
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel (one torch thread each)")
    parser.add_argument("--threshold", type=float, default=0.5, help="success level for 'iterations to reach'")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"subset of {','.join(CONFIGS)}")
    parser.add_argument("--model", default="artifacts/tiny-model", help="built with tiny_model when missing")
    parser.add_argument("--runs", default="runs/learning")
    parser.add_argument("--report-only", action="store_true", help="only rebuild the table and plot")
    parser.add_argument("--no-results", action="store_true", help="print only: write neither RESULTS.md nor the PNG")
    parser.add_argument("extra", nargs="*", help="extra overrides for every run (key=value)")
    args = parser.parse_args(argv)
    names = [n for n in args.configs.split(",") if n]
    unknown = set(names) - set(CONFIGS)
    if unknown:
        parser.error(f"unknown configs {sorted(unknown)}; known: {list(CONFIGS)}")
    seeds = list(range(args.seeds))
    command = "python benchmarks/learning.py " + " ".join(argv if argv is not None else sys.argv[1:])
    wall = None
    load = ""
    if not args.report_only:
        if not (Path(args.model) / "config.json").exists():
            sys.path.insert(0, str(REPO))
            from verl_gigpo.local.tiny_model import build_tiny_model

            build_tiny_model(args.model)
        jobs = [(name, seed) for seed in seeds for name in names]
        print(f"{len(jobs)} runs, {args.jobs} at a time", flush=True)
        start = time.perf_counter()
        load_before = os.getloadavg()
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            list(pool.map(lambda job: run_one(job[0], job[1], args), jobs))
        wall = time.perf_counter() - start
        load_after = os.getloadavg()
        load = (
            f"Machine load average (1/5/15 min) before: {', '.join(f'{x:.1f}' for x in load_before)}; "
            f"after: {', '.join(f'{x:.1f}' for x in load_after)} (2 cores, shared with other work)."
        )
    curves = load_curves(Path(args.runs), names, seeds)
    if not curves:
        print("no finished runs found", file=sys.stderr)
        return 1
    rows = summarise(curves, args.threshold)
    png = REPO / "benchmarks" / "learning.png"
    text = markdown(rows, args, command, wall, load)
    print(text)
    if not args.no_results:
        plot(curves, png, args.threshold, "gridnav with key: validation success")
        write_section(text, SECTION, REPO / "benchmarks" / "RESULTS.md")
        print(f"written: {REPO / 'benchmarks' / 'RESULTS.md'} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
