"""``python -m verl_gigpo.evaluate``: see :mod:`verl_gigpo.evaluate`."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from pathlib import Path

from verl_gigpo.evaluate import EvalOptions, evaluate_local, evaluate_verl


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return number


def _tasks(value: str) -> int | str:
    if value == "all":
        return value
    try:
        return _positive_int(value)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"--tasks {value}: a whole number >= 1, or 'all'") from None


def _temperature(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not number > 0:
        raise argparse.ArgumentTypeError(f"{value}: the sampling temperature must be > 0 (use --greedy for 0)")
    return number


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m verl_gigpo.evaluate``."""
    parser = argparse.ArgumentParser(
        prog="python -m verl_gigpo.evaluate",
        description="Evaluate a model (a Hugging Face folder, a local-engine run or checkpoint, a verl checkpoint) on "
        "an environment's evaluation split, with the settings of the run that made it: success per task type with "
        "95 percent intervals, pass@k, transcripts.",
    )
    parser.add_argument("model", help="Hugging Face folder, runs/NAME[/checkpoints/iter_K], or .../global_step_N")
    parser.add_argument(
        "--out",
        help="output folder (default runs/eval/<model>-<split>, numbered -2, -3 ... when taken); must not "
        "hold an evaluation",
    )
    parser.add_argument(
        "--env", help="environment (env.name); default: the run's (a verl run's launch record), else gridnav"
    )
    parser.add_argument("--split", help="evaluation split (ALFWorld valid_seen / valid_unseen; others test)")
    parser.add_argument("--tasks", type=_tasks, help="tasks of the split (seeds 0..N-1), or 'all' for its fixed list")
    parser.add_argument("-k", "--episodes", type=_positive_int, help="episodes per task (pass@k); default: the run's")
    decoding = parser.add_mutually_exclusive_group()
    decoding.add_argument("--greedy", action="store_true", help="greedy decoding")
    decoding.add_argument("--temperature", type=_temperature, help="sample at this temperature")
    parser.add_argument(
        "--settings",
        help="take the settings (env, prompt, limits, validation sampling) of this run: a local-engine run or "
        "checkpoint, or a verl experiment or checkpoint (its launch record)",
    )
    parser.add_argument("--seed", type=int, help="rollout seed: the request seeds derive from it (both engines)")
    parser.add_argument("--device", help="cpu, cuda or cuda:N (trainer.device)")
    parser.add_argument(
        "--engine",
        choices=("local", "verl"),
        default="local",
        help="local (default): this machine's CPU or one GPU, Hugging Face generation; verl: a trainer.val_only "
        "launch of verl's pipeline (vLLM on GPUs) with the overrides given after --",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument(
        "overrides",
        nargs="*",
        help="key=value items: the local engine's config (applied last), or with --engine verl the launch's "
        "overrides (a run's: python -m verl_gigpo.main ...), after --",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit status (2 for a bad argument, with one line saying what is wrong)."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    launch: list[str] = []
    if "--" in argv:  # everything after -- is the launch's (or the local config's) overrides, verbatim
        cut = argv.index("--")
        argv, launch = argv[:cut], argv[cut + 1 :]
    args = parser.parse_intermixed_args(argv)  # key=value overrides may follow the options
    if "=" in args.model and not Path(args.model).exists():
        parser.error(f"the model comes first, then options and key=value overrides; got {args.model!r} as the model")
    args.overrides = [*args.overrides, *launch]
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        parser.error(f"{bad[0]!r} is not key=value (options start with --; config keys are key=value)")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    warnings.filterwarnings("ignore", message=r".* engine is not available", category=UserWarning)
    if args.engine == "local":  # the local engine's output is the episode bar and the table: no loading chatter
        os.environ.setdefault("VERL_LOGGING_LEVEL", "WARNING")  # the plug-in's load line (verl's own variable)
        from transformers.utils import logging as transformers_logging

        transformers_logging.set_verbosity_error()
        transformers_logging.disable_progress_bar()
    options = EvalOptions(
        env=args.env,
        split=args.split,
        tasks=args.tasks,
        episodes=args.episodes,
        greedy=args.greedy or None,
        temperature=args.temperature,
        seed=args.seed,
        device=args.device,
        overrides=tuple(args.overrides) if args.engine == "local" else (),
    )
    out = Path(args.out) if args.out else None  # None: runs/eval/<model>-<split>, once the split is known
    try:
        if args.engine == "verl":
            if args.settings:
                parser.error("--settings reads a local-engine run; with --engine verl the overrides are the settings")
            evaluate_verl(args.model, out=out, options=options, launch=args.overrides)
        else:
            evaluate_local(args.model, out=out, options=options, settings=args.settings, progress=not args.quiet)
    except (ValueError, OSError, RuntimeError) as exc:  # OSError: FileNotFoundError, a folder that cannot be made
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
