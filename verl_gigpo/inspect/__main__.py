"""``python -m verl_gigpo.inspect RUN_DIR_OR_FILE [--iter K] [--group ID] [--out DIR] [--compare OTHER_RUN]
[--methods gigpo,hgpo,graphgpo,g2po] [--gamma G]`` (see the package doc)."""

from __future__ import annotations

import argparse
import sys

from verl_gigpo import STEP_CREDIT_ESTIMATORS
from verl_gigpo.config.rules import DEFAULT_GAMMA
from verl_gigpo.credit.load import CreditReportError
from verl_gigpo.credit.report import make_report


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: write the credit report, print its summary and where the files are; 2 on a usage error."""
    parser = argparse.ArgumentParser(
        prog="python -m verl_gigpo.inspect",
        description="Report on what the step-credit estimator (gigpo, hgpo, graphgpo, g2po) credited: the "
        "anchor-state graph of one episode group, distributions over the run, and a summary (from the records of "
        "trainer.credit_log_freq > 0)",
    )
    parser.add_argument("source", help="run directory (trainer.default_local_dir), its credit/ folder, or one file")
    parser.add_argument("--iter", type=int, default=None, help="iteration to draw (default: the last logged)")
    parser.add_argument("--group", default=None, help="episode group to draw (default: the one with most step signal)")
    parser.add_argument("--out", default=None, help="output folder (default: <credit folder>/report)")
    parser.add_argument(
        "--compare",
        default=None,
        help="another run (or credit file): draw its credit of the same iteration and group beside this run's",
    )
    parser.add_argument(
        "--methods",
        default="",
        help="credit the drawn group's rows again with these estimators and draw them side by side, e.g. "
        "gigpo,hgpo,graphgpo,g2po (their default options)",
    )
    parser.add_argument(
        "--gamma", type=float, default=DEFAULT_GAMMA, help=f"the discount --methods uses (default {DEFAULT_GAMMA})"
    )
    args = parser.parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    unknown = [m for m in methods if m not in STEP_CREDIT_ESTIMATORS]
    if unknown:
        parser.error(f"--methods: {unknown} are not step-credit estimators; use {','.join(STEP_CREDIT_ESTIMATORS)}")
    if not 0.0 <= args.gamma <= 1.0:
        parser.error(f"--gamma={args.gamma} must be in [0, 1]")
    try:
        report = make_report(
            args.source,
            iteration=args.iter,
            group=args.group,
            out_dir=args.out,
            compare=args.compare,
            methods=methods,
            gamma=args.gamma,
        )
    except CreditReportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report.summary)
    for label, path in report.files().items():
        print(f"{label}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
