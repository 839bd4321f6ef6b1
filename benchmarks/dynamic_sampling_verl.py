"""Dynamic sampling through verl's pipeline: GiGPO, GiGPO + the ``signal`` filter and GRPO (issue 28, part 3).

    python benchmarks/dynamic_sampling_verl.py                 # 3 configurations x 3 seeds x 150 iterations
    python benchmarks/dynamic_sampling_verl.py --seeds 1 --iters 30   # a quick look
    python benchmarks/dynamic_sampling_verl.py --report-only   # rebuild the table and plot from the kept data

Each run is ``python -m verl_gigpo.main platform=cpu`` with the settings of the learning benchmark's verl runs
(``benchmarks/learning.py --engine verl --task key --tasks 4 --group 8 --opt-steps 1``: one table of overrides,
``learning_settings.verl_overrides``; no local twins): gridnav with a key, 4 tasks x 8 episodes per iteration,
one optimizer step per iteration, validation on ``--val-size`` (128) fixed tasks every ``--test-freq`` iterations.
The start model wins a few percent of its validation episodes (``--model``, by default the tiny model fine-tuned to
imitate the expert with probability 0.6, built when missing with ``learning_settings.IMITATE_COMMAND``).

Unlike the local benchmark (``benchmarks/dynamic_sampling.py``, one budget of episodes for every configuration),
every run here trains ``--iters`` iterations, as the issue asks: ``gigpo_signal`` plays more episodes per
iteration (it replaces dropped groups by fresh tasks, at most ``max_num_gen_batches`` = 10 rounds). The report
therefore gives both views: validation success after the iterations, and validation success at the last
validation within the episodes the runs without dynamic sampling played (``iters x tasks x group``), with the
curves plotted against training episodes played.

Its runs are the learning benchmark's verl cells (``--runs runs/learning-verl``, kept data in
``benchmarks/data/learning-verl/verl``): the launches are the same overrides, so the GiGPO and GRPO runs of the
paired study (``benchmarks/learning.py``) serve both sections, and only ``gigpo_signal`` is launched here.

``--jobs`` runs go side by side (default 3: on 2 cores three launches keep both busy through their start-ups and
validations). Outputs: ``benchmarks/dynamic_sampling_verl.png`` and the section
"## Dynamic sampling through verl's pipeline" of ``benchmarks/RESULTS.md`` (replaced in place). Each finished run's
data are kept in ``--data`` (default ``benchmarks/data/learning-verl``; cells already kept are skipped unless
``--rerun``).
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dynamic_sampling import paired_lines, plot  # noqa: E402
from kept_data import NO_KEPT_DATA, add_kept_options, default_data_dir, refused_in_one_line, shown  # noqa: E402
from learning import parse_args as learning_args  # noqa: E402
from learning_report import kept_line, load_line, machine_load, model_description  # noqa: E402
from learning_run import episodes_per_iteration, load_run, run_verl, val_success, write_tasks  # noqa: E402
from learning_settings import CONFIGS, IMITATE_MODEL, REPO, TASK, TASK_TITLES, ensure_start_model  # noqa: E402
from results_md import add_output_options, write_section  # noqa: E402

SECTION = "## Dynamic sampling through verl's pipeline"
MODEL = IMITATE_MODEL
PNG = "dynamic_sampling_verl.png"
CONFIG_NAMES = ("gigpo", "gigpo_signal", "grpo")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring); ``args.learning`` holds the learning benchmark's arguments the
    runs are launched with."""
    parser = argparse.ArgumentParser(
        prog="python benchmarks/dynamic_sampling_verl.py", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--configs", default=",".join(CONFIG_NAMES), help="learning_settings.CONFIGS names")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 (data.seed: the order of the tasks)")
    parser.add_argument("--iters", type=int, default=150, help="training iterations per run")
    parser.add_argument("--test-freq", type=int, default=15, help="validate every N iterations")
    parser.add_argument("--model", default=MODEL, help=f"start model (the default is built when missing: {MODEL})")
    parser.add_argument("--runs", default="runs/learning-verl", help="run folders (shared with benchmarks/learning.py)")
    parser.add_argument("--jobs", type=int, default=3, help="launches side by side")
    parser.add_argument("--val-size", type=int, default=128, help="validation tasks (128)")
    parser.add_argument("--verl-timeout", type=float, default=10000, help="seconds one launch may take")
    parser.add_argument("--baseline", default="gigpo", help="the configuration the paired differences are taken from")
    add_output_options(parser)
    add_kept_options(parser)
    args = parser.parse_args(argv)
    for name in ("jobs", "seeds", "iters", "test_freq", "val_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    unknown = [name for name in args.configs.split(",") if name not in CONFIGS]
    if unknown:
        parser.error(f"--configs: unknown {unknown}; known: {', '.join(CONFIGS)}")
    given = ["--engine", "verl", "--task", "key", "--tasks", "4", "--group", "8", "--opt-steps", "1"]
    given += ["--iters", str(args.iters), "--test-freq", str(args.test_freq), "--seeds", str(args.seeds)]
    given += ["--configs", args.configs, "--model", args.model, "--runs", args.runs, "--no-twin"]
    given += ["--verl-timeout", str(args.verl_timeout), "--val-size", str(args.val_size)]
    given += ["--data", str(args.data or default_data_dir(args.runs)), *(["--rerun"] if args.rerun else [])]
    args.learning, args.names = learning_args(given)
    args.data = args.learning.data
    return args


# ---------------------------------------------------------------------------------------------- report
def episode_budget(args: argparse.Namespace) -> int:
    """Training episodes a run without dynamic sampling plays: iterations x tasks x group."""
    return args.learning.iters * args.learning.tasks * args.learning.group


def run_stats(rows: list[dict[str, Any]], budget: float) -> dict[str, Any]:
    """One run's numbers from its verl metric rows (one per iteration; step 0: the validation before training).

    Returns ``curve`` ((episodes played, validation success) at each validation, (V,) arrays), ``start``,
    ``final``, ``mean_val`` (over the validations after the start), ``at_budget`` (the last validation within
    ``budget`` training episodes), ``episodes`` (played in all), ``train_last`` (success of the training episodes
    played in the last 15 iterations: every round's with dynamic sampling, ``dynamic/played_success_rate``, not the
    kept groups' alone, which the filter biases towards wins; else the batch's, ``env/success_rate``),
    ``iterations`` and the dynamic metrics' per-iteration means (nan without dynamic sampling)."""
    played, x, y = 0.0, [], []
    train = [r for r in rows if "episode/num_trajectories" in r]
    for row in rows:
        if "episode/num_trajectories" in row:
            played += episodes_per_iteration(row)
        success = val_success(row)
        if success is not None:
            x.append(played)
            y.append(success)
    x_arr, y_arr = np.array(x), np.array(y)

    def mean_of(key: str) -> float:
        values = [r[key] for r in train if key in r]
        return float(np.mean(values)) if values else float("nan")

    return {
        "curve": (x_arr, y_arr),
        "start": float(y_arr[0]),
        "final": float(y_arr[-1]),
        "mean_val": float(y_arr[1:].mean()) if len(y_arr) > 1 else float("nan"),
        "at_budget": float(y_arr[x_arr <= budget][-1]),
        "episodes": played,
        "iterations": len(train),
        "train_last": float(
            np.mean([r.get("dynamic/played_success_rate", r["env/success_rate"]) for r in train[-15:]])
        ),
        "kept_by_step_signal_only": mean_of("dynamic/kept_by_step_signal_only"),
        "rounds": mean_of("dynamic/rounds"),
        "kept_fraction_round_1": mean_of("dynamic/kept_fraction_round_1"),
    }


def summary(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Per configuration: ``seeds`` and per-seed :func:`run_stats` (``runs``), ``curves`` ({seed: curve}) and
    ``seconds`` ({seed: the launch's wall time}); finished runs only."""
    budget = episode_budget(args)
    out: dict[str, dict[str, Any]] = {}
    for name in args.names:
        found = {}
        for seed in range(args.seeds):
            rows, launch = load_run(Path(args.runs) / "verl", args.data, f"verl/{name}", seed, "verl", args.learning)
            if launch is None or launch["returncode"] != 0:
                continue
            found[seed] = (run_stats(rows, budget), launch["wall_s"])
        if found:
            out[name] = {
                "seeds": sorted(found),
                "runs": {s: st for s, (st, _) in found.items()},
                "curves": {s: st["curve"] for s, (st, _) in found.items()},
                "final": {s: st["final"] for s, (st, _) in found.items()},
                "mean": {s: st["mean_val"] for s, (st, _) in found.items() if not np.isnan(st["mean_val"])},
                "seconds": {s: wall for s, (_, wall) in found.items()},
            }
    return out


def _pm(values: list[float]) -> str:
    return f"{np.mean(values):.2f} ± {np.std(values):.2f}"


def markdown(stats: dict, args: argparse.Namespace, command: str, wall: float | None, load: str) -> str:
    """The RESULTS.md section: settings, the table (mean ± std over seeds), final success per seed, the plot."""
    budget = episode_budget(args)
    lines = [
        SECTION,
        "",
        f"Command: `{command}`",
        "",
        f"Model: `{args.model}` ({model_description(args.model)}). Task: {TASK_TITLES['key']} ({' '.join(TASK)}); "
        f"{args.iters} iterations x ({args.learning.tasks} tasks x {args.learning.group} episodes, more with dynamic "
        "sampling: at most 10 rounds an "
        f"iteration), one optimizer step per iteration; validation on {args.val_size} fixed test-split tasks every "
        f"{args.test_freq} iterations (sampled, temperature 1); seeds {', '.join(map(str, range(args.seeds)))} "
        f"(`data.seed`: the order of the training tasks; the train split holds {args.iters} x {args.learning.tasks} "
        "tasks, and a "
        "dynamic run that draws more goes through their shuffled list again). Every other setting is the "
        "learning benchmark's verl "
        'column (section "Learning through verl\'s pipeline"). Mean ± std over seeds (population std). '
        f"'At {budget} episodes': the last validation within the training episodes a run without dynamic "
        "sampling plays in all.",
        "",
        "| config | seeds | val success at start | final val success | mean val success over training | "
        f"val success at {budget} episodes | success of the episodes played, last 15 it. | episodes played | "
        "kept by step signal only (per it.) | rounds per it. | kept fraction, round 1 | wall s per run |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, st in stats.items():
        runs = list(st["runs"].values())
        dyn = [np.mean([r[k] for r in runs]) for k in ("kept_by_step_signal_only", "rounds", "kept_fraction_round_1")]
        cells = [_pm([r[k] for r in runs]) for k in ("start", "final", "mean_val", "at_budget", "train_last")]
        cells.append(f"{np.mean([r['episodes'] for r in runs]):.0f}")
        cells += ["-" if np.isnan(v) else f"{v:.2f}" for v in dyn]
        cells.append(f"{np.mean(list(st['seconds'].values())):.0f}")
        lines.append(f"| {name} | {len(runs)} | " + " | ".join(cells) + " |")
    seeds = range(args.seeds)
    lines += ["", "Final validation success per seed (start → final):", ""]
    lines.append("| config | " + " | ".join(f"seed {s}" for s in seeds) + " |")
    lines.append("|---|" + "---|" * args.seeds)
    for name, st in stats.items():
        runs = st["runs"]
        cells = [f"{runs[s]['start']:.2f} → {runs[s]['final']:.2f}" if s in runs else "-" for s in seeds]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", *paired_lines(stats, args.baseline), kept_line(args.data), ""]
    lines += [f"![validation success against training episodes played, through verl]({PNG})", ""]
    lines += [
        "What the two dynamic-sampling benchmarks say: "
        "[docs/dynamic-sampling.md](../docs/dynamic-sampling.md#measured).",
        "",
    ]
    if wall is not None:
        lines += [f"Wall time of the whole benchmark: {wall / 60:.0f} min ({args.jobs} launches side by side). {load}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run the cells whose kept data do not exist yet (all with ``--rerun``; ``--jobs`` launches side by side), then
    write the report."""
    return refused_in_one_line(lambda: _run(argv))


def _run(argv: list[str] | None) -> int:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))  # verl_gigpo, for the launches and for reading verl's metrics files
    args = parse_args(argv)
    given = sys.argv[1:] if argv is None else argv
    command = " ".join(["python benchmarks/dynamic_sampling_verl.py", *given])
    args.learning.command = command
    wall, load = None, ""
    if not args.report_only:
        ensure_start_model(args.model)
        data_dir = write_tasks(args.learning)  # once, before the launches that read it
        before, start = machine_load(), time.perf_counter()
        jobs = [(name, seed) for seed in range(args.seeds) for name in args.names]
        print(f"{len(jobs)} verl launches, {args.jobs} at a time", flush=True)
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            list(pool.map(lambda job: run_verl(job[0], job[1], args.learning, data_dir), jobs))
        wall, load = time.perf_counter() - start, load_line(before, machine_load())
    stats = summary(args)
    if not stats:
        print(f"{NO_KEPT_DATA} under {shown(args.data)} and no finished run under {args.runs}/verl", file=sys.stderr)
        return 1
    text = markdown(stats, args, command, wall, load)
    print(text)
    if not args.no_results:
        results = Path(args.results)
        plot(stats, results.parent / PNG, title=f"{TASK_TITLES['key']} through verl")
        write_section(text, SECTION, results)
        print(f"written: {results} and {results.parent / PNG}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
