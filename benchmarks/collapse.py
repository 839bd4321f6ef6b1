"""The fall-back study (issue "See whether a run is learning", item 4): the local twin of the verl learning
benchmark's GiGPO run, unchanged and with single changes, on paired seeds, with the health alarms on.

    python benchmarks/collapse.py                                # none, lr3e-4, eps0.1 x seeds 0-2; skips kept cells
    python benchmarks/collapse.py --changes none,lr3e-4 --seeds 0 1 2 --jobs 2
    python benchmarks/collapse.py --report-only                  # table and plot from benchmarks/data/collapse/

Each cell is ``python -m verl_gigpo.local.train`` with ``learning_settings.twin_overrides("gigpo", seed, ...)`` for
the verl benchmark's arguments (key task, 4 tasks x 8 episodes, one optimizer step, 150 iterations, validation
every 15 on ``--val-size`` tasks, the p = 0.6 imitation start ``--model``), plus the change's overrides. Seeds pair
the runs: the same task draws and, with seeded sampling, the same validation random numbers. A finished run's
metrics and its alarms (``health.jsonl``) go to ``benchmarks/data/collapse/<change>-seed<k>.jsonl.gz`` at once.

"No longer collapses" (the issue's bar): every seed's last validation >= 0.8 x its own best, and the mean best at
least the unchanged settings'.
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

from kept_data import KeptDataError, kept_file, read_kept, run_missing_cells, shown, write_kept  # noqa: E402
from learning import parse_args as learning_args  # noqa: E402
from learning_settings import twin_overrides  # noqa: E402
from results_md import add_output_options, emit_section  # noqa: E402

HEADING = "## The fall-back: GiGPO's local twin, unchanged and with single changes"

#: the changes tried, each a list of overrides added to the unchanged twin
CHANGES: dict[str, list[str]] = {
    "none": [],
    "lr3e-4": ["actor_rollout_ref.actor.optim.lr=3e-4"],
    "norm_mean": ["algorithm.gigpo.norm=mean"],
    "eps0.1": ["algorithm.gigpo.epsilon=0.1"],
}

#: the health metrics of the unchanged run of seed 0, with its alarms (docs/watching-a-run.md shows it)
HEALTH_PNG = "collapse_health.png"

#: the one-seed confirmation through verl's pipeline (its kept data under --verl-data, label verl/gigpo)
VERL_CONFIRM = (
    "python benchmarks/learning.py --engine verl --configs gigpo --seeds 1 --task key --tasks 4 --group 8 --opt-steps 1"
    " --iters 150 --test-freq 15 --val-size 64 --model artifacts/tiny-model-imitate-key06 --no-twin"
    " --runs runs/collapse-verl --data benchmarks/data/collapse-verl --no-results actor_rollout_ref.actor.optim.lr=3e-4"
)

#: what the "no longer collapses" bar asks: last validation >= this x the run's best
KEEP_SHARE = 0.8


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (module docstring); bad values are refused by name."""
    parser = argparse.ArgumentParser(description="GiGPO's fall-back on the local engine: paired single changes")
    parser.add_argument(
        "--changes",
        default="none,lr3e-4,eps0.1",
        help=f"comma-separated, of {list(CHANGES)} (default: all but norm_mean, which the issue tried)",
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--iters", type=int, default=150)
    parser.add_argument("--val-size", type=int, default=64, help="validation tasks (the issue's twin: 64)")
    parser.add_argument("--model", default="artifacts/tiny-model-imitate-key06", help="the start model")
    parser.add_argument("--runs", default="runs/collapse", help="run folders (not committed)")
    parser.add_argument("--data", default="benchmarks/data/collapse", help="kept data (committed)")
    parser.add_argument(
        "--verl-data",
        default="benchmarks/data/collapse-verl",
        help="kept runs of the change confirmed through verl's pipeline (VERL_CONFIRM: benchmarks/learning.py)",
    )
    parser.add_argument("--jobs", type=int, default=2, help="runs side by side (one torch thread each)")
    parser.add_argument("--rerun", action="store_true", help="run cells that already have kept data again")
    add_output_options(parser)
    args = parser.parse_args(argv)
    args.change_names = [c for c in args.changes.split(",") if c]
    unknown = sorted(set(args.change_names) - set(CHANGES))
    if unknown:
        parser.error(f"unknown --changes {unknown}; known: {list(CHANGES)}")
    for key in ("iters", "val_size", "jobs"):
        if getattr(args, key) < 1:
            parser.error(f"--{key.replace('_', '-')} must be >= 1, got {getattr(args, key)}")
    return args


def overrides(change: str, seed: int, args: argparse.Namespace, out: Path) -> list[str]:
    """The local engine's overrides of one cell: the verl benchmark's twin of GiGPO, then the change."""
    given = ["--engine", "verl", "--task", "key", "--tasks", "4", "--group", "8", "--opt-steps", "1"]
    given += ["--iters", str(args.iters), "--test-freq", "15", "--val-size", str(args.val_size)]
    given += ["--configs", "gigpo", "--model", args.model, "--runs", str(out.parent), "--no-twin"]
    bench, _ = learning_args(given)
    bench.extra = [e for e in bench.extra if not e.startswith("actor_rollout_ref.actor.optim.lr=")]  # lr: the change's
    return [*twin_overrides("gigpo", seed, bench, out), *CHANGES[change]]


def run_cell(change: str, seed: int, args: argparse.Namespace) -> str:
    """Train one cell and keep its metrics and alarms; returns a line saying so."""
    out = Path(args.runs) / f"{change}-seed{seed}"
    items = overrides(change, seed, args, out)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "verl_gigpo.local.train", *items], env=env, capture_output=True)
    if done.returncode != 0:
        return f"{change} seed {seed}: FAILED (exit {done.returncode}): {done.stderr.decode()[-1500:]}"
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    health = out / "health.jsonl"
    alarms = [json.loads(x) for x in health.read_text().splitlines()] if health.exists() else []
    launch = {"wall_s": round(time.perf_counter() - began, 1), "returncode": 0, "alarms": alarms}
    command = "python -m verl_gigpo.local.train " + " ".join(items)
    path = write_kept(
        kept_file(args.data, change, seed),
        rows,
        overrides=items,
        args={"change": change, "seed": seed},
        command=command,
        launch=launch,
    )
    return f"{change} seed {seed}: kept {shown(path)} ({launch['wall_s']:.0f} s, {len(alarms)} alarm(s))"


def _curve(rows: list[dict]) -> list[tuple[int, float]]:
    return [(int(r["training_step"]), float(r["val/success_rate"])) for r in rows if "val/success_rate" in r]


def report(args: argparse.Namespace) -> str:
    """The RESULTS.md section (and the plot beside it) from the kept files under ``args.data``."""
    cells: dict[str, dict[int, tuple[dict, list[dict]]]] = {}
    for change in CHANGES:
        for path in sorted(Path(args.data).glob(f"{change}-seed*.jsonl.gz")):
            header, rows = read_kept(path)
            cells.setdefault(change, {})[int(header["args"]["seed"])] = (header, rows)
    if not cells:
        raise KeptDataError(f"no kept data under {args.data}: run `python benchmarks/collapse.py` first")
    lines = [
        HEADING,
        "",
        "The local twin of the verl learning benchmark's GiGPO run (key task, 4 tasks x 8 episodes, lr 1e-3, one",
        f"optimizer step, validation every 15 iterations on {args.val_size} tasks, the p = 0.6 imitation start), on",
        "paired seeds, unchanged (`none`) and with one change each. Bar: every seed's last validation >= 0.8 x its",
        "best, and the mean best at least the unchanged settings'. Alarms: `trainer.health` (warn), the first",
        "iteration of each.",
        "",
        f"Command: `python benchmarks/collapse.py`. Kept data: `{shown(args.data)}/`.",
        "",
        "| change | seed | start | best (iteration) | last | last / best | invalid replies per step, first → last 30"
        " it. | alarms (first iteration) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    summary = {}
    for change, seeds in cells.items():
        bests, kept = [], []
        for seed, (header, rows) in sorted(seeds.items()):
            curve = _curve(rows)
            best_it, best = max(curve, key=lambda c: (c[1], -c[0]))
            last = curve[-1][1]
            share = last / best if best > 0 else float("nan")
            train = [r for r in rows if "env/invalid_action_rate" in r]
            first30 = sum(r["env/invalid_action_rate"] for r in train[:30]) / max(len(train[:30]), 1)
            last30 = sum(r["env/invalid_action_rate"] for r in train[-30:]) / max(len(train[-30:]), 1)
            alarms: dict[str, int] = {}
            for a in (header.get("launch") or {}).get("alarms", []):
                alarms.setdefault(a["signal"], a["iteration"])
            said = ", ".join(f"{s} ({i})" for s, i in alarms.items()) or "none"
            lines.append(
                f"| {change} | {seed} | {curve[0][1]:.3f} | {best:.3f} ({best_it}) | {last:.3f} | {share:.2f} | "
                f"{first30:.3f} → {last30:.3f} | {said} |"
            )
            bests.append(best)
            kept.append(best > 0 and last >= KEEP_SHARE * best)
        summary[change] = (sum(bests) / len(bests), sum(kept), len(kept))
    lines += [
        "",
        "| change | seeds | mean best | seeds with last >= 0.8 x best | meets the bar |",
        "|---|---|---|---|---|",
    ]
    base = summary.get("none", (None,))[0]
    for change, (mean_best, ok, n) in summary.items():
        meets = ok == n and (base is None or mean_best >= base)
        lines.append(f"| {change} | {n} | {mean_best:.3f} | {ok}/{n} | {'yes' if meets else 'no'} |")
    lines += _verl_lines(Path(args.verl_data))
    if not args.no_results:
        _plot(cells, Path(args.results).with_name("collapse.png"))
        lines += ["", "![validation success and invalid replies per step, per change and seed](collapse.png)"]
        if 0 in cells.get("none", {}):
            header, rows = cells["none"][0]
            _plot_health(rows, (header.get("launch") or {}).get("alarms", []), Path(args.results).with_name(HEALTH_PNG))
            lines += ["", f"The unchanged run of seed 0, as `trainer.health` saw it: ![health metrics]({HEALTH_PNG})"]
    return "\n".join(lines) + "\n"


def _verl_lines(folder: Path) -> list[str]:
    """The confirmation through verl's pipeline: one line per kept verl run under ``folder``, or none."""
    from learning_run import val_success

    lines = []
    for path in sorted(folder.glob("verl/*-seed*.jsonl.gz")):
        header, rows = read_kept(path)
        curve = [(int(r["step"]), val_success(r)) for r in rows if val_success(r) is not None]
        best_it, best = max(curve, key=lambda c: (c[1], -c[0]))
        seed = path.name.rpartition("-seed")[2].removesuffix(".jsonl.gz")
        run = f"{path.parent.name}/{path.name.split('-seed')[0]}"
        lines.append(
            f"| {run} | {seed} | {curve[0][1]:.3f} | {best:.3f} ({best_it}) | {curve[-1][1]:.3f} | "
            f"{curve[-1][1] / best if best else float('nan'):.2f} | " + ", ".join(f"{v:.2f}" for _, v in curve) + " |"
        )
    if not lines:
        return []
    head = [
        "",
        f"Through verl's pipeline (`platform=cpu`, one seed, lr 3e-4, the same settings): `{VERL_CONFIRM}`.",
        "",
        "| run | seed | start | best (iteration) | last | last / best | validation every 15 iterations |",
        "|---|---|---|---|---|---|---|",
    ]
    return head + lines


def _plot(cells: dict, path: Path) -> None:
    """Validation success (top) and invalid replies per step (bottom, 10-iteration means) per change and seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (change, seeds) in enumerate(cells.items()):
        for j, (_, (_, rows)) in enumerate(sorted(seeds.items())):
            label = change if j == 0 else None
            xs, ys = zip(*_curve(rows), strict=True)
            top.plot(xs, ys, color=colours[i % len(colours)], alpha=0.8, label=label, marker=".")
            train = [r for r in rows if "env/invalid_action_rate" in r]
            means = [
                sum(r["env/invalid_action_rate"] for r in train[k : k + 10]) / 10 for k in range(0, len(train), 10)
            ]
            bottom.plot([10 * (k + 1) for k in range(len(means))], means, color=colours[i % len(colours)], alpha=0.8)
    top.set_ylabel("validation success")
    top.legend(loc="upper left", fontsize=8)
    bottom.set_ylabel("invalid replies per step\n(10-iteration mean)")
    bottom.set_xlabel("iteration")
    fig.suptitle("GiGPO's local twin: unchanged and single changes, paired seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_health(rows: list[dict], alarms: list[dict], path: Path) -> None:
    """Four panels of one run (validation and training success, invalid replies per step, entropy, grad norm),
    10-iteration means, with a line at each alarm's first iteration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in rows if "actor/pg_loss" in r]

    def means(key: str) -> tuple[list[int], list[float]]:
        xs, ys = [], []
        for k in range(0, len(train), 10):
            chunk = [r[key] for r in train[k : k + 10] if key in r]
            if chunk:
                xs.append(int(train[min(k + 9, len(train) - 1)]["training_step"]))
                ys.append(sum(chunk) / len(chunk))
        return xs, ys

    panels = [
        ("success", "env/success_rate"),
        ("invalid replies per step", "env/invalid_action_rate"),
        ("entropy", "actor/entropy"),
        ("grad norm", "actor/grad_norm"),
    ]
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 8), sharex=True)
    first: dict[str, int] = {}
    for a in alarms:
        first.setdefault(a["signal"], a["iteration"])
    at: dict[int, list[str]] = {}  # one label per iteration, the signals that fired first there
    for signal, iteration in first.items():
        at.setdefault(iteration, []).append(signal)
    for ax, (label, key) in zip(axes, panels, strict=True):
        ax.plot(*means(key), marker=".", label="training (10-iteration mean)")
        if key == "env/success_rate":
            ax.plot(*zip(*_curve(rows), strict=True), marker="o", label="validation")
            ax.legend(loc="upper left", fontsize=8)
        for iteration, signals in at.items():
            ax.axvline(iteration, color="red", alpha=0.4, linestyle="--")
            if ax is axes[0]:
                ax.annotate(
                    ", ".join(signals),
                    (iteration, ax.get_ylim()[1]),
                    fontsize=7,
                    color="red",
                    xytext=(3, -10),
                    textcoords="offset points",
                )
        ax.set_ylabel(label)
    axes[-1].set_xlabel("iteration")
    fig.suptitle("A run falling back, and the health alarms it raised (dashed: first iteration of each)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (module docstring)."""
    args = parse_args(argv)
    if not args.report_only:
        run_missing_cells(args.change_names, args.seeds, args, run_cell)
    return emit_section(lambda: report(args), HEADING, args)


if __name__ == "__main__":
    sys.exit(main())
