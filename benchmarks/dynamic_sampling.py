"""Dynamic sampling benchmark: does keeping the groups that carry only step signal pay? (issue 28)

    python benchmarks/dynamic_sampling.py                       # 5 configurations x 10 seeds (~2 h on 2 cores)
    python benchmarks/dynamic_sampling.py --seeds 2 --iters 20  # a quick look
    python benchmarks/dynamic_sampling.py --report-only         # rebuild the table and plot from the kept data

The local learning benchmark's task and start (``benchmarks/learning.py``: gridnav with a key, the random tiny
model, ~2 % success at the start, 8 tasks x 8 episodes per iteration), on the local engine, with five
configurations:

* ``gigpo``: GiGPO without dynamic sampling;
* ``gigpo_episode``: GiGPO + the reference's filter (``algorithm.filter_groups.filter=episode``: drop a group whose
  episode returns are all equal, play fresh tasks for it, at most ``--max-rounds`` rounds an iteration);
* ``gigpo_signal``: GiGPO + ``filter=signal`` (also keep a group whose step term is nonzero somewhere);
* ``dapo``: GRPO + ``filter=episode`` (DAPO's dynamic sampling);
* ``graphgpo_signal``: GraphGPO (the successor with the best final success in the successors benchmark) +
  ``filter=signal``.

Every run gets the same budget of **training episodes played** (``--iters`` x tasks x group): dynamic sampling plays
more episodes per iteration, so its runs stop after fewer iterations (``trainer.total_training_episodes``). The
report puts validation success against episodes played (``rollout/episodes_played_total``), and gives per
configuration the final success (mean ± std over seeds, and per seed), the episodes played until validation first
reached 0.5, the wall time, and where the kept groups came from (``dynamic/*``: groups kept by the step signal only,
rounds per iteration, kept fraction of the first round).

What to expect from the filters on this task: its only reward is the win (no per-step reward, and decoding is
restricted to the action words, so no invalid-action penalty). A group whose episodes all fail then has R_t = 0 on
every row, so GiGPO's step term is zero there and ``signal`` drops it as ``episode`` does; the two filters differ
only on groups whose episodes all win (their step returns differ by the discount). On tasks with rewards inside
failed episodes (invalid-action penalties, Sokoban's per-move cost, WebShop's partial scores) ``signal`` keeps
all-fail groups too (a two-iteration CPU launch of the Sokoban recipe kept every group for its step term alone).

Outputs: ``benchmarks/dynamic_sampling.png`` and the section "## Dynamic sampling: does keeping step signal pay?" of
``benchmarks/RESULTS.md`` (replaced in place), with the exact command. Runs go to ``--runs`` (default
``runs/dynamic``), one folder per (configuration, seed); each finished run's data are kept in ``--data`` (default
``benchmarks/data/dynamic``; cells already kept are skipped unless ``--rerun``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kept_data import NO_KEPT_DATA, add_kept_options, default_data_dir, kept_file, refused_in_one_line, shown  # noqa: E402
from learning_report import kept_line, load_line, machine_load  # noqa: E402
from learning_run import _run_local, cell_done, keep, load_run, val_success  # noqa: E402
from learning_settings import CONFIGS, TASK, TASK_TITLES  # noqa: E402
from paired import paired_table  # noqa: E402
from results_md import add_output_options, write_section  # noqa: E402

SECTION = "## Dynamic sampling: does keeping step signal pay?"
PNG = "dynamic_sampling.png"


def _dynamic(estimator: str, kind: str) -> tuple[str, ...]:
    return (
        *CONFIGS[estimator],
        "algorithm.filter_groups.enable=true",
        f"algorithm.filter_groups.filter={kind}",
    )


#: name -> overrides (the rounds' limit is added per run: --max-rounds)
DYNAMIC_CONFIGS: dict[str, tuple[str, ...]] = {
    "gigpo": CONFIGS["gigpo"],
    "gigpo_episode": _dynamic("gigpo", "episode"),
    "gigpo_signal": _dynamic("gigpo", "signal"),
    "dapo": _dynamic("grpo", "episode"),
    "graphgpo_signal": _dynamic("graphgpo", "signal"),
}
THRESHOLD = 0.5


def budget(args: argparse.Namespace) -> int:
    """Training episodes every run plays: iterations x tasks x group of the run without dynamic sampling."""
    return args.iters * args.tasks * args.group


def overrides(name: str, seed: int, args: argparse.Namespace, out: Path) -> list[str]:
    """The local engine's overrides of one run (``python -m verl_gigpo.local.train``)."""
    dynamic = "algorithm.filter_groups.enable=true" in DYNAMIC_CONFIGS[name]
    return [
        f"actor_rollout_ref.model.path={args.model}",
        f"trainer.default_local_dir={out}",
        "trainer.overwrite=true",
        # an upper bound: a dynamic run stops at the episode budget first
        f"trainer.total_training_steps={args.iters}",
        f"trainer.total_training_episodes={budget(args)}",
        f"trainer.test_freq={args.test_freq}",
        f"trainer.save_freq={args.iters}",
        f"trainer.seed={seed}",
        f"data.val_size={args.val_size}",
        f"data.train_batch_size={args.tasks}",
        f"actor_rollout_ref.rollout.n={args.group}",
        "local.num_threads=1",
        "local.progress=false",
        "local.plot=false",
        *TASK,
        *DYNAMIC_CONFIGS[name],
        *([f"algorithm.filter_groups.max_num_gen_batches={args.max_rounds}"] if dynamic else []),
    ]


def read_rows(run: Path) -> list[dict[str, Any]]:
    """The run's metric rows (``metrics.jsonl``), [] when it has none."""
    path = run / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def finished(run: Path, args: argparse.Namespace) -> bool:
    """The run played its episode budget (or its iterations) and validated at the end."""
    rows = read_rows(run)
    played = max((r.get("rollout/episodes_played_total", 0) for r in rows), default=0)
    done = played >= budget(args) or any(r["step"] == args.iters for r in rows)
    return done and val_success(rows[-1]) is not None


def run_one(name: str, seed: int, args: argparse.Namespace) -> None:
    """Train one (configuration, seed), one torch thread, unless its kept data exist (or its folder finished; with
    ``--rerun``: always), then keep its data."""
    out = Path(args.runs) / f"{name}_s{seed}"
    kept = kept_file(args.data, name, seed)
    run_overrides = overrides(name, seed, args, out)
    if cell_done(kept, run_overrides, args):
        return
    if args.rerun or not finished(out, args):
        _run_local(run_overrides, f"{name} seed {seed}")
    keep(out, "local", kept, run_overrides, args)


# ---------------------------------------------------------------------------------------------- report
def curve(rows: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """``(episodes played, validation success)`` at each validation of a run (V,), episodes 0 at the start."""
    played = {0: 0.0}
    for r in rows:
        if "rollout/episodes_played_total" in r:
            played[r["step"]] = float(r["rollout/episodes_played_total"])
    points = [(played.get(r["step"], np.nan), val_success(r)) for r in rows if val_success(r) is not None]
    x, y = zip(*points, strict=True) if points else ((), ())
    return np.array(x, dtype=float), np.array(y, dtype=float)


def first_reach(x: np.ndarray, y: np.ndarray, threshold: float = THRESHOLD) -> float:
    """Episodes played at the first validation with success >= threshold (nan when never)."""
    hit = np.flatnonzero(y >= threshold)
    return float(x[hit[0]]) if hit.size else float("nan")


def summary(args: argparse.Namespace, names: list[str], seeds: list[int]) -> dict[str, dict[str, Any]]:
    """Per configuration: per-seed curves, finals, episodes to the threshold, wall seconds and dynamic diagnostics."""
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        runs = {s: load_run(Path(args.runs), args.data, name, s, "local", args)[0] for s in seeds}
        runs = {s: rows for s, rows in runs.items() if rows and val_success(rows[-1]) is not None}
        if not runs:
            continue
        curves = {s: curve(rows) for s, rows in runs.items()}
        train = {s: [r for r in rows if "rollout/episodes_played_total" in r] for s, rows in runs.items()}

        def mean_of(key: str, rows_by_seed: dict = train) -> float:
            values = [r[key] for rows in rows_by_seed.values() for r in rows if key in r]
            return float(np.mean(values)) if values else float("nan")

        out[name] = {
            "seeds": sorted(runs),
            "curves": curves,
            "final": {s: float(y[-1]) for s, (_, y) in curves.items()},
            "mean": {s: float(y[1:].mean()) for s, (_, y) in curves.items() if len(y) > 1},
            "reach": {s: first_reach(x, y) for s, (x, y) in curves.items()},
            "iterations": {s: len(rows) for s, rows in train.items()},
            "seconds": {
                s: sum(r.get("timing_s/step", 0.0) + r.get("timing_s/testing", 0.0) for r in rows)
                for s, rows in runs.items()
            },
            "kept_by_step_signal_only": mean_of("dynamic/kept_by_step_signal_only"),
            "rounds": mean_of("dynamic/rounds"),
            "kept_fraction_round_1": mean_of("dynamic/kept_fraction_round_1"),
        }
    return out


def paired_lines(stats: dict[str, dict[str, Any]], baseline: str) -> list[str]:
    """Markdown: each configuration's paired difference from ``baseline`` in final validation success and in
    validation success averaged over the validations after the start (:func:`paired.paired_table`)."""
    per_seed = {name: {"final": st["final"], "mean": st["mean"]} for name, st in stats.items()}
    table = paired_table(
        per_seed,
        dict.fromkeys(per_seed, baseline),
        {"final": "final val success", "mean": "mean val success over training"},
    )
    if not table:
        return [f"No paired comparison: the baseline `{baseline}` was not run here.", ""]
    return [
        f"Paired differences from `{baseline}` (`--baseline`), seed by seed (same seed, same validation tasks, the "
        "same training-episode budget): mean and 95 % interval from the paired t with seeds − 1 degrees of freedom.",
        "",
        *table,
        "",
    ]


def _pm(values: list[float]) -> str:
    return f"{np.mean(values):.2f} ± {np.std(values):.2f}"


def markdown(
    stats: dict, args: argparse.Namespace, seeds: list[int], command: str, wall: float | None, load: str
) -> str:
    """The RESULTS.md section."""
    lines = [
        SECTION,
        "",
        f"Command: `{command}`",
        "",
        f"Task: {TASK_TITLES['key']} ({' '.join(TASK)}); tiny model `{args.model}` (random weights, decoding "
        f"restricted to the action words); {args.tasks} tasks x {args.group} episodes per round; budget "
        f"{budget(args)} training episodes per run (= {args.iters} iterations without dynamic sampling); dynamic "
        f"runs: at most {args.max_rounds} rounds an iteration (the reference's max_num_gen_batches); validation on "
        f"{args.val_size} fixed test-split tasks every {args.test_freq} iterations (sampled, temperature 1); seeds "
        f"{', '.join(map(str, seeds))}. Mean ± std over seeds (population std).",
        "",
        "| config | seeds | final val success | seeds reaching 0.50 | median episodes to 0.50 | iterations | wall s "
        "per run | kept by step signal only (per it.) | rounds per it. | kept fraction, round 1 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, st in stats.items():
        reach = np.array(list(st["reach"].values()))
        median = f"{np.nanmedian(reach):.0f}" if np.isfinite(reach).any() else "-"
        dyn = [st["kept_by_step_signal_only"], st["rounds"], st["kept_fraction_round_1"]]
        dyn_cells = ["-" if np.isnan(v) else f"{v:.2f}" for v in dyn]
        lines.append(
            f"| {name} | {len(st['seeds'])} | {_pm(list(st['final'].values()))} | {int(np.isfinite(reach).sum())}/"
            f"{len(reach)} | {median} | {np.mean(list(st['iterations'].values())):.0f} | "
            f"{np.mean(list(st['seconds'].values())):.0f} | " + " | ".join(dyn_cells) + " |"
        )
    lines += ["", "Final validation success per seed:", ""]
    lines.append("| config | " + " | ".join(f"seed {s}" for s in seeds) + " |")
    lines.append("|---|" + "---|" * len(seeds))
    for name, st in stats.items():
        cells = [f"{st['final'][s]:.2f}" if s in st["final"] else "-" for s in seeds]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", *paired_lines(stats, args.baseline), kept_line(args.data), ""]
    lines += [f"![success against episodes played]({PNG})", ""]
    if wall is not None:
        lines += [f"Wall time of the whole benchmark: {wall / 60:.0f} min ({args.jobs} runs in parallel). {load}", ""]
    return "\n".join(lines) + "\n"


def plot(stats: dict, path: Path, title: str = "dynamic sampling on gridnav with a key") -> None:
    """Validation success against training episodes played: the mean over seeds (interpolated on a common grid) and
    each seed's points, one colour per configuration; ``stats[name]["curves"]`` = {seed: (episodes (V,), success
    (V,))}."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.8))
    for name, st in stats.items():
        xs = [x for x, _ in st["curves"].values()]
        grid = np.linspace(0, max(float(np.nanmax(x)) for x in xs), 40)
        ys = [np.interp(grid, x[np.isfinite(x)], y[np.isfinite(x)]) for x, y in st["curves"].values()]
        (line,) = ax.plot(grid, np.mean(ys, axis=0), lw=2, label=f"{name} (n={len(ys)})")
        for x, y in st["curves"].values():
            ax.plot(x, y, ".", color=line.get_color(), alpha=0.25, ms=3)
    ax.axhline(THRESHOLD, color="grey", lw=0.8, ls=":")
    ax.set(xlabel="training episodes played", ylabel="validation success (sampled)", ylim=(-0.02, 1.02))
    ax.set_title(f"{title}: success against episodes played", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python benchmarks/dynamic_sampling.py", description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=10, help="seeds 0..N-1 (default 10)")
    parser.add_argument("--iters", type=int, default=150, help="iterations of the run without dynamic sampling")
    parser.add_argument("--tasks", type=int, default=8, help="tasks per round (data.train_batch_size)")
    parser.add_argument("--group", type=int, default=8, help="episodes per task (actor_rollout_ref.rollout.n)")
    parser.add_argument("--max-rounds", type=int, default=10, help="rounds per iteration at most (dynamic runs)")
    parser.add_argument("--test-freq", type=int, default=15, help="validate every N iterations")
    parser.add_argument("--val-size", type=int, default=128, help="validation tasks (128)")
    parser.add_argument("--configs", default=",".join(DYNAMIC_CONFIGS), help="comma-separated configurations")
    parser.add_argument("--model", default="artifacts/tiny-model", help="start model (built when missing)")
    parser.add_argument("--runs", default="runs/dynamic", help="run folders")
    parser.add_argument("--jobs", type=int, default=2, help="runs side by side (one torch thread each)")
    parser.add_argument("--baseline", default="gigpo", help="the configuration the paired differences are taken from")
    add_output_options(parser)
    add_kept_options(parser)
    args = parser.parse_args(argv)
    args.data = Path(args.data) if args.data else default_data_dir(args.runs)
    unknown = [n for n in args.configs.split(",") if n not in DYNAMIC_CONFIGS]
    if unknown:
        parser.error(f"--configs: unknown {unknown}; choose from {', '.join(DYNAMIC_CONFIGS)}")
    for name in ("seeds", "iters", "tasks", "group", "max_rounds", "test_freq", "val_size", "jobs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the cells whose kept data do not exist yet (all with ``--rerun``), then write the report."""
    return refused_in_one_line(lambda: _run(argv))


def _run(argv: list[str] | None) -> int:
    args = parse_args(argv)
    names = args.configs.split(",")
    seeds = list(range(args.seeds))
    command = "python benchmarks/dynamic_sampling.py " + " ".join(sys.argv[1:] if argv is None else argv)
    args.command = command.strip()
    wall = None
    load = ""
    if not args.report_only:
        if not (Path(args.model) / "config.json").exists():
            from verl_gigpo.dev.tiny_model import build_tiny_model

            build_tiny_model(args.model)
        before, start = machine_load(), time.perf_counter()
        jobs = [(name, seed) for seed in seeds for name in names]
        print(f"{len(jobs)} runs, {args.jobs} at a time, {budget(args)} training episodes each", flush=True)
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            list(pool.map(lambda job: run_one(job[0], job[1], args), jobs))
        wall = time.perf_counter() - start
        load = load_line(before, machine_load())
    stats = summary(args, names, seeds)
    if not stats:
        print(f"{NO_KEPT_DATA} under {shown(args.data)} and no finished run under {args.runs}", file=sys.stderr)
        return 1
    text = markdown(stats, args, seeds, command.strip(), wall, load)
    print(text)
    if not args.no_results:
        results = Path(args.results)
        plot(stats, results.parent / PNG)
        write_section(text, SECTION, results)
        print(f"wrote {results} and {results.parent / PNG}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
