"""Learning benchmark: GiGPO against GRPO, paired, on both engines (the default); the local engine's estimator
suites (``--engine local``).

    python benchmarks/learning.py                          # the paired study (hours on 2 cores; resumable)
    python benchmarks/learning.py --verl-seeds 0           # its local-engine part only (--jobs runs side by side)
    python benchmarks/learning.py --report-only            # rebuild its section and plot from the kept data
    python benchmarks/learning.py --engine local           # GiGPO's sweep, GRPO and RLOO on the local engine
    python benchmarks/learning.py --engine local --suite successors --jobs 1    # GiGPO, HGPO, GraphGPO, G2PO, GRPO

The paired study (issue "Evidence that holds", item 5): gridnav with a key, 4 tasks x 8 episodes per iteration, one
optimizer step, 150 iterations, validation on 128 tasks every 15, from the p = 0.6 imitation model
(``learning_settings.IMITATE_MODEL``: it wins a few percent) at the fall-back study's stable learning rate
(``--lr 3e-4``). The local engine trains GiGPO, GRPO, GiGPO + the ``episode`` filter and GiGPO + the ``signal``
filter on 10 seeds; verl's pipeline trains GiGPO and GRPO on seeds 0-2 (``--verl-configs``, ``--verl-seeds``).
Every (engine, configuration, seed) cell is kept in ``benchmarks/data/learning-verl/`` as it finishes and skipped
when run again. The section gives each configuration's paired difference from GRPO per engine, with 95 % intervals,
and says which comparisons the data support.

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
with the exact command. Runs go to ``--runs`` (default ``runs/learning``), one folder per (config, seed); each
finished run's data are kept in ``--data`` (default ``benchmarks/data/<name of --runs>``, committed; cells already
kept are skipped unless ``--rerun``; ``docs/benchmarks.md``, "Kept data").
``--suite successors`` runs GiGPO, its successors HGPO, GraphGPO and G2PO (``docs/estimators.md``, default options;
HGPO keys up to the last 3 states, K = 2, as the paper, although the prompt shows no history) and GRPO on the same
task, seeds and budget, with credit records every ``--credit-freq`` iterations, into ``runs/learning-successors``,
``benchmarks/learning_successors.png`` and the section "## Learning: GiGPO and its successors" (a table per seed
too).

``--engine verl``: GiGPO vs GRPO through verl's own pipeline on this CPU — one ``python -m verl_gigpo.main
platform=cpu`` launch per (configuration, seed), run one after another (verl already uses several processes),
reading verl's own logged metrics (its file logger: ``ckpt/metrics.jsonl`` in the experiment folder). Beside them
("twins", one torch thread, alongside the verl launches; ``--no-twin`` skips them) the local engine trains the same
configurations with the same settings, so the two engines' curves share a plot. Both engines start from the model
that already answers in gridnav's action format (``--model``, default ``artifacts/tiny-model-actions``, built when
missing with ``python -m verl_gigpo.dev.tiny_model --out artifacts/tiny-model-actions --envs gridnav
--sft-actions``), both sample over the full vocabulary (the twins run with ``local.constrain_to_actions=false``),
and every setting the engines share is set on both from one table (``learning_settings.shared_settings``,
printed into RESULTS.md). Outputs: ``benchmarks/learning_verl.png`` and the section "## Learning through verl's
pipeline: GiGPO vs GRPO"; runs under ``--runs`` (default ``runs/learning-verl``): ``verl/<config>_s<seed>/``
(``train.log``, ``launch.json``, ``ckpt/metrics.jsonl``, ``ckpt/credit/``) and ``local/<config>_s<seed>/``.

A verl run of the paired study takes about 15-30 min on 2 cores (150 iterations of ~470 step rows). Deviations of
the verl runs:

1. Task seeds: verl plays the training tasks 0 .. tasks x iterations - 1 of the train split in the order of its
   dataloader (``data.seed`` = the run's seed), each once; the local engine draws fresh task seeds every iteration.
2. Sampling: both engines seed each request from the run's seed, the task, the member and the step
   (``docs/reproducibility.md``), so a seed's validations use the same random numbers for every configuration on
   one engine; the two engines' training episodes still differ (deviation 1).
3. Mini-batches: the local engine takes ``tasks / opt_steps`` whole tasks per optimizer step; verl's
   ``gigpo_sync`` mode at most ``ceil(tasks x group x max_steps / opt_steps)`` step rows, shuffled across tasks,
   so an iteration with shorter episodes can take fewer steps (``update/num_mini_batches`` logs them).

The code: ``learning_settings.py`` (the task, configurations, defaults and every run's overrides),
``learning_run.py`` (launching the runs, verl's through :func:`verl_gigpo.dev.smoke.run_pipeline`, and reading their
metrics), ``learning_report.py`` (curves, tables, plot, RESULTS.md sections); this file is the command line.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from kept_data import NO_KEPT_DATA, KeptDataError, add_kept_options, default_data_dir, shown
from learning_report import (  # benchmarks/ is on sys.path when this runs as a script
    load_curves,
    load_line,
    machine_load,
    markdown,
    markdown_verl,
    plot,
    summarise,
    train_window,
)
from learning_run import run_benchmark
from learning_settings import (
    CONFIGS,
    ENGINE_DEFAULTS,
    ENGINES,
    REPO,
    SECTION_VERL,
    SUITES,
    TASK_TITLES,
    TASKS,
    VERL_CONFIGS,
)
from results_md import add_output_options, write_section


def _parser() -> argparse.ArgumentParser:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="verl",
        help="verl (default): the paired study, verl's pipeline with the local engine's twins beside; local: the "
        "local engine's estimator suites",
    )
    parser.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (local 5, verl 10: the twins)")
    parser.add_argument("--iters", type=int, default=None, help="iterations per run (150)")
    parser.add_argument("--test-freq", type=int, default=None, help="validate every N iterations (15)")
    parser.add_argument("--task", choices=TASKS, default=None, help="verl: the task (key, goal; default key)")
    parser.add_argument("--tasks", type=int, default=None, help="tasks per iteration (local 8, verl 4)")
    parser.add_argument("--group", type=int, default=None, help="episodes per task (8)")
    parser.add_argument("--opt-steps", type=int, default=None, help="verl: optimizer steps per iteration (1)")
    parser.add_argument("--val-size", type=int, default=128, help="validation tasks (128)")
    parser.add_argument("--jobs", type=int, default=2, help="local engine: runs in parallel (one torch thread each)")
    parser.add_argument("--threshold", type=float, default=0.5, help="success level for 'iterations to reach'")
    parser.add_argument("--configs", default=None, help=f"subset of {','.join(CONFIGS)} (verl default: gigpo,grpo)")
    parser.add_argument(
        "--suite",
        choices=SUITES,
        default="estimators",
        help="local engine: estimators (GiGPO's sweep, GRPO, RLOO; the default) or successors (GiGPO, HGPO, GraphGPO, "
        "G2PO, GRPO): default configs, RESULTS.md section, plot and run folder",
    )
    parser.add_argument(
        "--model", default=None, help="built when missing (local: tiny_model; verl: the p = 0.6 imitation model)"
    )
    parser.add_argument("--runs", default=None, help="run folders (runs/learning, runs/learning-verl)")
    parser.add_argument("--no-twin", action="store_true", help="verl: skip the local engine's runs beside")
    parser.add_argument(
        "--verl-seeds",
        type=int,
        default=None,
        help="verl: launch verl for seeds 0..N-1 only (default 3); the twins run every seed, --jobs at a time when "
        "no verl launch is left",
    )
    parser.add_argument(
        "--verl-configs",
        default=None,
        help="verl: launch verl for these configurations only (default: gigpo and grpo of --configs)",
    )
    parser.add_argument("--lr", default=None, help="verl: the actor's learning rate on both engines (default 3e-4)")
    parser.add_argument("--micro-batch", type=int, default=None, help="verl: rows per micro-batch (16; speed only)")
    parser.add_argument(
        "--credit-freq",
        type=int,
        default=None,
        help="credit records every N iterations of the step-credit runs (verl: both engines; local: --suite "
        "successors; default: iterations / 5; 0 = off)",
    )
    parser.add_argument("--verl-timeout", type=float, default=3600, help="verl: seconds one launch may take")
    parser.add_argument("--baseline", default="grpo", help="the configuration the paired differences are taken from")
    add_output_options(parser)
    add_kept_options(parser)
    parser.add_argument("extra", nargs="*", help="extra overrides for every run (key=value; verl: both engines)")
    return parser


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    """The command line's arguments with each engine's defaults filled in, checked (errors exit with status 2,
    naming the option); and the configurations to run."""
    parser = _parser()
    args = parser.parse_args(argv)
    defaults = dict(ENGINE_DEFAULTS[args.engine])
    if args.engine == "local":
        defaults.update(configs=SUITES[args.suite]["configs"], runs=SUITES[args.suite]["runs"])
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.data = Path(args.data) if args.data else default_data_dir(args.runs)
    if args.credit_freq is None:
        args.credit_freq = max(1, args.iters // 5)
    names = [n for n in args.configs.split(",") if n]
    unknown = set(names) - set(CONFIGS)
    if unknown:
        parser.error(f"unknown configs {sorted(unknown)}; known: {list(CONFIGS)}")
    if args.engine == "local" and (args.task != "key" or args.opt_steps != 1):
        parser.error("--task and --opt-steps apply to --engine verl (the local benchmark is fixed: key task, 1 step)")
    for key in ("seeds", "iters", "test_freq", "tasks", "group", "val_size", "micro_batch", "opt_steps"):
        if getattr(args, key) < 1:
            parser.error(f"--{key.replace('_', '-')} must be >= 1, got {getattr(args, key)}")
    args.verl_seeds = min(args.verl_seeds, args.seeds) if args.verl_seeds is not None else args.seeds
    if args.verl_configs is None:
        args.verl_names = [n for n in names if n in VERL_CONFIGS] or names
    else:
        args.verl_names = [n for n in args.verl_configs.split(",") if n]
    if args.lr is not None and not any(e.startswith("actor_rollout_ref.actor.optim.lr=") for e in args.extra):
        try:
            float(args.lr)
        except ValueError:
            parser.error(f"--lr must be a number, got {args.lr!r}")
        args.extra.append(f"actor_rollout_ref.actor.optim.lr={args.lr}")
    if set(args.verl_names) - set(names):
        parser.error(f"--verl-configs {sorted(set(args.verl_names) - set(names))} are not in --configs {names}")
    if args.verl_seeds < 0:
        parser.error(f"--verl-seeds must be >= 0, got {args.verl_seeds}")
    if args.tasks % args.opt_steps:
        parser.error(f"--tasks ({args.tasks}) must be a multiple of --opt-steps ({args.opt_steps})")
    return args, names


def report(args: argparse.Namespace, names: list[str], command: str, wall: float | None, load: str) -> int:
    """Build the section and the plot from the kept data under ``--data`` (else the finished runs under ``--runs``),
    print the section and (unless ``--no-results``) write it into ``--results`` and the PNG beside it. Returns the
    exit status (1: no kept data and no runs)."""
    seeds = list(range(args.seeds))
    results = Path(args.results)
    if args.engine == "verl":
        runs = Path(args.runs)
        curves = load_curves(
            runs / "verl", names, seeds, engine="verl", label="verl/{name}", data=args.data, expect=args
        )
        curves.update(load_curves(runs / "local", names, seeds, label="local/{name}", data=args.data, expect=args))
        section, png = SECTION_VERL, results.parent / "learning_verl.png"
        text = markdown_verl(curves, args, command, wall, load, png.name) if curves else ""
        title = f"{TASK_TITLES[args.task]}: verl (solid) vs local engine (dashed)"
    else:
        curves = load_curves(Path(args.runs), names, seeds, data=args.data, expect=args)
        section, png = SUITES[args.suite]["section"], results.parent / SUITES[args.suite]["png"]
        text = (
            markdown(curves, summarise(curves, args.threshold, train_window(args.iters)), args, command, wall, load)
            if curves
            else ""
        )
        title = "gridnav with a key: validation success" + (
            " (GiGPO and its successors)" if args.suite == "successors" else ""
        )
    if not curves:
        print(f"{NO_KEPT_DATA} under {shown(args.data)} and no finished runs under {args.runs}", file=sys.stderr)
        return 1
    print(text)
    if not args.no_results:
        results.parent.mkdir(parents=True, exist_ok=True)
        plot(curves, png, args.threshold, title, args.tasks * args.group if args.engine == "verl" else 1)
        write_section(text, section, results)
        print(f"written: {results} and {png}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (see the module docstring): run the (configuration, seed) cells whose kept data do not exist
    yet (all with ``--rerun``; none with ``--report-only``), then write the report."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))  # verl_gigpo, for the runs and for reading verl's metrics files
    args, names = parse_args(argv)
    given = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--report-only"]
    command = "`" + " ".join(["python benchmarks/learning.py", *given]) + "`"
    if args.report_only:
        command += " (tables rebuilt from the kept data or finished runs with `--report-only`)"
    args.command = " ".join(["python benchmarks/learning.py", *given])
    wall = None
    load = ""
    try:
        if not args.report_only:
            start = time.perf_counter()
            load_before = machine_load()
            run_benchmark(names, list(range(args.seeds)), args)
            wall = time.perf_counter() - start
            load = load_line(load_before, machine_load())
        return report(args, names, command, wall, load)
    except KeptDataError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
