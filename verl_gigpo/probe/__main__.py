"""``python -m verl_gigpo.probe``: see :mod:`verl_gigpo.probe`."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import sys
from pathlib import Path
from typing import Any, NoReturn

from verl_gigpo import STEP_CREDIT_ESTIMATORS
from verl_gigpo.config.rules import DEFAULT_GAMMA
from verl_gigpo.probe.keys import DEFAULT_KEYS


class _Parser(argparse.ArgumentParser):
    """argparse with its errors on one line (naming the option), exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (--help lists the options)\n")


def _whole(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None


def _number(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None


def _value(text: str) -> Any:
    """A ``key=value`` item's value: JSON when it parses (numbers, true/false, lists), else the text."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m verl_gigpo.probe``."""
    parser = _Parser(
        prog="python -m verl_gigpo.probe",
        description="Will step credit help here? Play episode groups of an environment (random valid actions, or "
        "--model) and report, per anchor-key mode, the anchor groups per episode group, the rows alone in their "
        "anchor group, the rows with a nonzero step term, and the groups an episode filter would drop despite step "
        "signal; recommend a key mode. Trailing key=value items are the environment's constructor arguments.",
    )
    parser.add_argument("--env", default="gridnav", help="environment name, or your own as package.module:Class")
    parser.add_argument("--groups", type=_whole, default=16, help="episode groups (tasks 0..N-1; default 16)")
    parser.add_argument("-n", "--episodes", dest="n", type=_whole, default=8, help="episodes per group (default 8)")
    parser.add_argument(
        "--keys",
        default=DEFAULT_KEYS,
        help=f"comma-separated key modes: observation, state, history:K, similarity:T (default {DEFAULT_KEYS})",
    )
    parser.add_argument("--split", default=None, help="task split (default: the environment's first)")
    parser.add_argument("--seed", type=_whole, default=0, help="seeds the random actions or the sampling (default 0)")
    parser.add_argument("--model", default=None, help="a Hugging Face model folder (default: random valid actions)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="with --model: a key of the local engine's config (verl_gigpo/config/local_trainer.yaml), e.g. "
        "actor_rollout_ref.rollout.response_length=64",
    )
    parser.add_argument("--device", default=None, help="with --model: cpu, cuda or cuda:N")
    parser.add_argument(
        "--method", default="gigpo", help=f"step-credit estimator: {', '.join(STEP_CREDIT_ESTIMATORS)} (default gigpo)"
    )
    parser.add_argument(
        "--gamma", type=_number, default=DEFAULT_GAMMA, help=f"discount of the step return (default {DEFAULT_GAMMA})"
    )
    parser.add_argument("--out", default=None, help="output folder (default runs/probe/<env>, numbered when taken)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("env_kwargs", nargs="*", metavar="KEY=VALUE", help="the environment's constructor arguments")
    return parser


def default_out(env: str) -> Path:
    """``runs/probe/<env>``, numbered ``-2``, ``-3`` ... when it already holds a probe summary."""
    base = Path("runs") / "probe" / "".join(c if c.isalnum() or c in "-_" else "_" for c in env)
    candidate, number = base, 1
    while (candidate / "summary.json").exists():
        number += 1
        candidate = base.with_name(f"{base.name}-{number}")
    return candidate


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit status (2 for bad input, with one line naming the option)."""
    from environments import env_target, resolve_env
    from verl_gigpo.probe.play import ProbeError
    from verl_gigpo.probe.report import headline, markdown_table, write_report
    from verl_gigpo.probe.run import ProbeOptions, run_probe

    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    kwargs: dict[str, Any] = {}
    for item in args.env_kwargs:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"{item!r} is not key=value (options start with --; environment arguments are key=value)")
        kwargs[key] = _value(value)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        env = resolve_env(args.env)
    except (ValueError, ImportError) as exc:
        parser.error(f"--env {args.env}: {exc}")
    registry = {env: env_target(env)} if ":" in args.env else None
    try:
        options = ProbeOptions(
            env=env,
            groups=args.groups,
            n=args.n,
            keys=args.keys,
            split=args.split,
            seed=args.seed,
            model=args.model,
            env_kwargs=kwargs,
            method=args.method,
            gamma=args.gamma,
            device=args.device,
            overrides=tuple(args.overrides),
            registry=registry,
        )
    except ValueError as exc:
        parser.error(str(exc))
    out = Path(args.out) if args.out else default_out(env)
    if (out / "summary.json").exists():
        parser.error(f"--out {out}: already holds a probe summary; choose another folder, or remove it first")
    if args.model is not None:  # the output is the episode bars and the table: no loading chatter
        os.environ.setdefault("VERL_LOGGING_LEVEL", "WARNING")  # the plug-in's load line (verl's own variable)
        from transformers.utils import logging as transformers_logging

        transformers_logging.set_verbosity_error()
        transformers_logging.disable_progress_bar()
    try:
        result = run_probe(options, progress=not args.quiet)
        report = write_report(result, out, command=_command(argv))
    except (ValueError, ImportError, RuntimeError) as exc:  # RuntimeError: ProbeError, EnvError
        kind = "error" if isinstance(exc, ValueError | ImportError | ProbeError) else type(exc).__name__
        print(f"{kind}: {exc}", file=sys.stderr)
        return 2
    print(f"\n{headline(result)}\n\n{markdown_table(result)}\n\n{result.recommendation.line}\n")
    print(f"table:   {report.table}")
    print(f"summary: {report.summary}")
    print(f"chart:   {report.plot}")
    print(f"page:    {report.html}")
    return 0


def _command(argv: list[str]) -> str:
    return shlex.join(["python", "-m", "verl_gigpo.probe", *argv])


if __name__ == "__main__":
    sys.exit(main())
