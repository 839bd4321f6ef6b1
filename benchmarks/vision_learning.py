"""Learning on images, locally (issue 40, item 6): a tiny random-init Qwen2.5-VL learns visual gridnav with GiGPO
and with GRPO, on paired seeds.

    python benchmarks/vision_learning.py                           # gigpo, grpo x seeds 0-2; skips kept cells
    python benchmarks/vision_learning.py --configs gigpo --seeds 0 --iters 20 --no-results   # a quick look
    python benchmarks/vision_learning.py --report-only             # table from benchmarks/data/vision/

The task: gridnav drawn as an image (``env.kwargs.observation=image``: the text says only that the grid is in the
image), 3x3 with no walls, the goal 1+ steps away, 4 steps. The model: ``python -m verl_gigpo.dev.tiny_vl_model``
(built into ``--model`` when missing; random init, ~0.3M parameters). Each cell is ``python -m
verl_gigpo.local.train`` with ``--tasks`` tasks x ``--group`` episodes per iteration, one optimizer step, validation
every ``--test-freq`` iterations on ``--val-size`` test tasks (sampled replies, seeded). A finished run's metrics go
to ``benchmarks/data/vision/<config>-seed<k>.jsonl.gz`` at once.

Deviations: one torch thread per run, at most ``--jobs`` runs side by side (the machine is shared).
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

from kept_data import KeptDataError, check_args, kept_file, read_kept, run_missing_cells, shown, write_kept  # noqa: E402
from results_md import add_output_options, emit_section  # noqa: E402

HEADING = "## Learning on images: a tiny vision-language model, GiGPO vs GRPO (local engine)"


#: the options that change the task or the update, their defaults and how a heading names them
VARIANTS = {
    "lr": (1e-3, "learning rate {:g}"),
    "tile_size": (16, "{0}-pixel cells"),
    "max_steps": (4, "{} steps"),
    "entropy_coeff": (0.0, "entropy bonus {:g}"),
    "imitate": (None, "imitation start (expert labels p = {:g})"),
    "probe_start": (None, "supervised start (an optimal move with probability {:g})"),
    "tasks": (8, "{} tasks an iteration"),
    "val_size": (32, "{} validation tasks"),
}


def heading(args: argparse.Namespace) -> str:
    """The section's heading: :data:`HEADING`, naming each of :data:`VARIANTS` that is not at its default (each such
    setting has its own section)."""
    named = [text.format(getattr(args, k)) for k, (default, text) in VARIANTS.items() if getattr(args, k) != default]
    return ", ".join([HEADING, *named])


def env_kwargs(args: argparse.Namespace) -> dict:
    """gridnav's arguments: 3x3, no walls, goal 1+ steps away, the state in the image only (``--tile-size``)."""
    return {"observation": "image", "tile_size": args.tile_size, "size": 3, "walls": 0, "min_path": 1}


def task(args: argparse.Namespace) -> list[str]:
    """The task's overrides: :func:`env_kwargs`, ``--max-steps`` steps, no history."""
    kwargs = [f"env.kwargs.{k}={v}" for k, v in env_kwargs(args).items()]
    return ["env.name=gridnav", *kwargs, f"env.max_steps={args.max_steps}", "env.history_length=0"]


#: the estimator of each configuration
CONFIGS = {"gigpo": ["algorithm.adv_estimator=gigpo"], "grpo": ["algorithm.adv_estimator=grpo"]}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (module docstring); bad values are refused by name."""
    parser = argparse.ArgumentParser(description="a tiny VL model learning visual gridnav: GiGPO vs GRPO")
    parser.add_argument("--configs", default="gigpo,grpo", help=f"comma-separated, of {list(CONFIGS)}")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--iters", type=int, default=80)
    parser.add_argument("--tasks", type=int, default=8, help="tasks (episode groups) per iteration")
    parser.add_argument("--group", type=int, default=8, help="episodes per task")
    parser.add_argument("--val-size", type=int, default=32, help="validation tasks")
    parser.add_argument("--test-freq", type=int, default=20, help="validate every N iterations")
    parser.add_argument("--lr", type=float, default=1e-3, help="actor learning rate (the local engine's default)")
    parser.add_argument("--tile-size", type=int, default=16, help="pixels per grid cell (28: one image token a cell)")
    parser.add_argument("--max-steps", type=int, default=4, help="steps per episode")
    parser.add_argument("--entropy-coeff", type=float, default=0.0, help="entropy bonus of the actor loss")
    parser.add_argument("--model", default=None, help="the tiny VL model (built if missing; default under artifacts/)")
    parser.add_argument(
        "--imitate",
        type=float,
        default=None,
        metavar="P",
        help="start from the model fine-tuned on the task's expert actions with probability P (tiny_vl --imitate)",
    )
    parser.add_argument(
        "--probe-start",
        type=float,
        default=None,
        metavar="P",
        help="start from the random model trained by benchmarks/vision_probe.py --expert P (--probe-steps steps)",
    )
    parser.add_argument("--probe-steps", type=int, default=150, help="full-batch steps of --probe-start")
    parser.add_argument("--runs", default="runs/vision", help="run folders (not committed)")
    parser.add_argument("--data", default="benchmarks/data/vision", help="kept data (committed)")
    parser.add_argument(
        "--tried", default="benchmarks/data/vision-tried", help="kept data of the settings tried on the way (a table)"
    )
    parser.add_argument("--tried-only", action="store_true", help="only write the 'what was tried' section")
    parser.add_argument("--jobs", type=int, default=2, help="runs side by side (one torch thread each)")
    parser.add_argument("--rerun", action="store_true", help="run cells that already have kept data again")
    add_output_options(parser)
    args = parser.parse_args(argv)
    args.config_names = [c for c in args.configs.split(",") if c]
    unknown = sorted(set(args.config_names) - set(CONFIGS))
    if unknown:
        parser.error(f"unknown --configs {unknown}; known: {list(CONFIGS)}")
    if not 4 <= args.tile_size <= 64:
        parser.error(f"--tile-size must be in [4, 64] (gridnav's tile_size), got {args.tile_size}")
    if args.imitate is not None and not 0 <= args.imitate <= 1:
        parser.error(f"--imitate takes a probability in [0, 1], got {args.imitate}")
    if args.probe_start is not None and not 0 <= args.probe_start <= 1:
        parser.error(f"--probe-start takes a probability in [0, 1], got {args.probe_start}")
    if args.probe_start is not None and args.imitate is not None:
        parser.error("give one start: --imitate or --probe-start, not both")
    if args.model is None:
        start = "" if args.imitate is None else f"-imitate{args.imitate:g}-tile{args.tile_size}-steps{args.max_steps}"
        if args.probe_start is not None:
            start = f"-probe{args.probe_start:g}-tile{args.tile_size}-s{args.probe_steps}"
        args.model = f"artifacts/tiny-vl-gridnav{start}"
    for key in ("iters", "tasks", "group", "val_size", "test_freq", "jobs", "max_steps"):
        if getattr(args, key) < 1:
            parser.error(f"--{key.replace('_', '-')} must be >= 1, got {getattr(args, key)}")
    return args


def overrides(config: str, seed: int, args: argparse.Namespace, out: Path) -> list[str]:
    """The local engine's overrides of one cell."""
    return [
        f"actor_rollout_ref.model.path={args.model}",
        "actor_rollout_ref.model.trust_remote_code=true",  # the tiny model's images-only processor class
        *task(args),
        *CONFIGS[config],
        f"actor_rollout_ref.rollout.n={args.group}",
        f"data.train_batch_size={args.tasks}",
        f"actor_rollout_ref.actor.optim.lr={args.lr:g}",
        f"actor_rollout_ref.actor.entropy_coeff={args.entropy_coeff:g}",
        f"data.val_size={args.val_size}",
        "data.max_prompt_length=512",
        f"trainer.total_training_steps={args.iters}",
        f"trainer.test_freq={args.test_freq}",
        f"trainer.seed={seed}",
        f"trainer.default_local_dir={out}",
        "trainer.save_freq=-1",
        "local.num_threads=1",
        "local.progress=false",
        "local.plot=false",
    ]


def model_command(args: argparse.Namespace) -> list[str]:
    """The command that builds ``--model``: random init, then with ``--imitate P`` the imitation fine-tuning on the
    task (walks of ``--max-steps`` steps)."""
    if args.probe_start is not None:
        base = "artifacts/tiny-vl-gridnav"  # the random model, built by vision_probe.py when missing
        return [sys.executable, "benchmarks/vision_probe.py", "--model", base, "--tile-sizes", str(args.tile_size)] + [
            "--expert",
            f"{args.probe_start:g}",
            "--steps",
            str(args.probe_steps),
            "--save",
            args.model,
        ]
    cmd = [sys.executable, "-m", "verl_gigpo.dev.tiny_vl_model", "--out", args.model]
    if args.imitate is not None:
        cmd += ["--imitate", f"gridnav:{args.imitate:g}", "--imitate-kwargs", json.dumps(env_kwargs(args))]
        cmd += ["--imitate-max-steps", str(args.max_steps)]
    return cmd


def ensure_model(args: argparse.Namespace) -> None:
    """Build the tiny VL model into ``--model`` (:func:`model_command`) when it is not there."""
    if (Path(args.model) / "config.json").is_file():
        return
    cmd = model_command(args)
    subprocess.run(cmd, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def run_cell(config: str, seed: int, args: argparse.Namespace) -> str:
    """Train one cell and keep its metrics; returns a line saying so."""
    out = Path(args.runs) / f"{config}-seed{seed}"
    items = overrides(config, seed, args, out)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    began = time.perf_counter()
    cmd = ["nice", "-n", "15", sys.executable, "-m", "verl_gigpo.local.train", *items, "--overwrite"]
    done = subprocess.run(cmd, env=env, capture_output=True)
    if done.returncode != 0:
        return f"{config} seed {seed}: FAILED (exit {done.returncode}): {done.stderr.decode()[-1500:]}"
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    launch = {"wall_s": round(time.perf_counter() - began, 1), "returncode": 0}
    path = write_kept(
        kept_file(args.data, config, seed),
        rows,
        overrides=items,
        args={
            "config": config,
            "seed": seed,
            "iters": args.iters,
            "tasks": args.tasks,
            "group": args.group,
            "val_size": args.val_size,
            "test_freq": args.test_freq,
            "lr": args.lr,
            "tile_size": args.tile_size,
            "max_steps": args.max_steps,
            "entropy_coeff": args.entropy_coeff,
            "imitate": args.imitate,
            "probe_start": args.probe_start,
            "model_command": " ".join(["python", *model_command(args)[1:]]),
        },
        command="python -m verl_gigpo.local.train " + " ".join(items),
        launch=launch,
    )
    return f"{config} seed {seed}: kept {shown(path)} ({launch['wall_s']:.0f} s)"


def _curve(rows: list[dict]) -> list[tuple[int, float]]:
    return [(int(r["training_step"]), float(r["val/success_rate"])) for r in rows if "val/success_rate" in r]


def report(args: argparse.Namespace) -> str:
    """The RESULTS.md section from the kept files under ``args.data``."""
    start = "A random-init tiny Qwen2.5-VL (`verl_gigpo.dev.tiny_vl_model`, ~0.3M parameters)"
    if args.probe_start is not None:
        start = (
            "A tiny Qwen2.5-VL (~0.3M parameters) trained from random init, supervised and full-batch, on the 72 "
            f"drawings of the task's states towards an optimal move with probability {args.probe_start:g} (a "
            f"uniformly random action otherwise) for {args.probe_steps} steps, just past the plateau where it starts "
            f"to read the drawing (`{' '.join(['python', *model_command(args)[1:]])}`),"
        )
    if args.imitate is not None:
        start = (
            "A tiny Qwen2.5-VL (~0.3M parameters) fine-tuned, supervised, to imitate the task's shortest-path expert "
            f"from the drawings: the expert's action with probability {args.imitate:g}, a random one otherwise "
            f"(`{' '.join(['python', *model_command(args)[1:]])}`),"
        )
    lines = [
        heading(args),
        "",
        f"`python benchmarks/vision_learning.py` (kept data: `{shown(args.data)}`). {start} on gridnav drawn as a "
        f"{3 * args.tile_size}x{3 * args.tile_size} image (3x3, no walls, {args.max_steps} steps; the text holds no "
        f"state), {args.tasks} tasks x {args.group} episodes per iteration, "
        f"{args.iters} iterations, learning rate {args.lr:g}, entropy bonus {args.entropy_coeff:g}, one optimizer "
        f"step per iteration, validation success on {args.val_size} test tasks (sampled replies). Local engine, one "
        "CPU thread per run.",
        "",
        "| method | seed | before | best | after | train success, first 10 -> last 10 iterations | minutes |",
        "|---|---|---|---|---|---|---|",
    ]
    means: dict[str, list[tuple[float, float]]] = {}
    entropy: dict[str, list[tuple[float, float]]] = {}  # per seed: mean entropy of the first and last 10 iterations
    for config in CONFIGS:
        for seed in args.seeds:
            path = kept_file(args.data, config, seed)
            if not path.exists():
                continue
            header, rows = read_kept(path)
            check_args(path, header, args)
            for key, (default, _) in VARIANTS.items():
                if header["args"].get(key, default) != getattr(args, key):
                    flag = "--" + key.replace("_", "-")
                    raise KeptDataError(
                        f"{path}: kept with {flag} {header['args'].get(key, default)}, this report asks "
                        f"{getattr(args, key)}: give the options of the command that made it"
                    )
            curve = _curve(rows)
            train = [float(r["env/success_rate"]) for r in rows if "env/success_rate" in r]
            if not curve or not train:
                continue
            before, after, best = curve[0][1], curve[-1][1], max(v for _, v in curve)
            head, tail = sum(train[:10]) / len(train[:10]), sum(train[-10:]) / len(train[-10:])
            minutes = header["launch"]["wall_s"] / 60
            lines.append(
                f"| {config} | {seed} | {before:.2f} | {best:.2f} | {after:.2f} | {head:.2f} -> {tail:.2f} | "
                f"{minutes:.1f} |"
            )
            means.setdefault(config, []).append((before, after))
            ent = [float(r["actor/entropy"]) for r in rows if "actor/entropy" in r]
            if ent:
                entropy.setdefault(config, []).append((sum(ent[:10]) / len(ent[:10]), sum(ent[-10:]) / len(ent[-10:])))
    if not means:
        return "\n".join([*lines, "", "no kept data"])
    lines.append("")
    for config, pairs in means.items():
        b = sum(p[0] for p in pairs) / len(pairs)
        a = sum(p[1] for p in pairs) / len(pairs)
        moved = ""
        if entropy.get(config):  # how far the policy moved from uniform over the 4 actions (ln 4 = 1.39)
            first, last = (sum(e[k] for e in entropy[config]) / len(entropy[config]) for k in (0, 1))
            moved = f"; policy entropy {first:.2f} -> {last:.2f} (uniform over 4 actions: 1.39)"
        lines.append(f"- {config}: mean validation success {b:.2f} -> {a:.2f} over {len(pairs)} seed(s){moved}")
    return "\n".join(lines)


def tried_table(folder: str | Path) -> list[str]:
    """The "what was tried" table: one row per kept file under ``folder`` (one GiGPO run of a setting, its header's
    ``setting`` and ``outcome`` written when it was kept), with its first and last training means; [] when none."""
    lines = []
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    for path in sorted(Path(folder).glob("*.jsonl.gz")):
        header, rows = read_kept(path)
        train = [float(r["env/success_rate"]) for r in rows if "env/success_rate" in r]
        ent = [float(r["actor/entropy"]) for r in rows if "actor/entropy" in r]
        val = [f"{v:.2f}" for _, v in _curve(rows)]
        if not train or not ent:
            continue
        lines.append(
            f"| {header['args']['setting']} | {len(train)} | {mean(train[:10]):.2f} -> {mean(train[-10:]):.2f} | "
            f"{mean(ent[:10]):.2f} -> {mean(ent[-10:]):.2f} | {' '.join(val)} | {header['args']['outcome']} |"
        )
    if not lines:
        return []
    head = [
        TRIED_HEADING,
        "",
        f"`python benchmarks/vision_learning.py --tried-only` (kept data: `{shown(folder)}`): one GiGPO run of each "
        "setting, seed 0, 3x3 gridnav drawn without walls, goal 1+ steps away, local engine, one CPU thread, stopped "
        "when flat. Validation success every 20-50 iterations (32 test tasks, sampled). Diagnosis: docs/vision.md.",
        "",
        "| setting | iterations | train success, first 10 -> last 10 | entropy, first 10 -> last 10 | "
        "validation success | outcome |",
        "|---|---|---|---|---|---|",
    ]
    return head + lines


#: the heading of the "what was tried" section (``--tried-only``)
TRIED_HEADING = f"{HEADING}: what was tried"


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (module docstring)."""
    args = parse_args(argv)
    if args.tried_only:
        return emit_section(
            lambda: "\n".join(tried_table(args.tried) or [TRIED_HEADING, "", "no kept data"]), TRIED_HEADING, args
        )
    if not args.report_only:
        ensure_model(args)
        run_missing_cells(args.config_names, args.seeds, args, run_cell)
    return emit_section(lambda: report(args), heading(args), args)


if __name__ == "__main__":
    sys.exit(main())
