"""Write one benchmark's section into benchmarks/RESULTS.md, leaving the other sections as they are."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def write_section(text: str, heading: str, path: Path = RESULTS) -> None:
    """Replace the section that starts with ``heading`` (a ``## ...`` line) by ``text`` in place, or append it."""
    if not text.startswith(heading):
        raise ValueError(f"the section text must start with its heading {heading!r}")
    old = path.read_text() if path.exists() else "# Benchmark results\n"
    if heading not in old:
        path.write_text(old.rstrip() + "\n\n" + text.rstrip() + "\n")
        return
    start = old.index(heading)  # replaced in place: the other sections keep their order
    nxt = old.find("\n## ", start + len(heading))
    rest = "" if nxt == -1 else "\n" + old[nxt + 1 :]
    path.write_text(old[:start] + text.rstrip() + "\n" + rest)


def emit_section(build: Callable[[], str], heading: str, args: argparse.Namespace) -> int:
    """Print the section ``build()`` makes and (unless ``--no-results``) write it into ``--results``; a refusal of
    the kept data (:class:`kept_data.KeptDataError`) is one ``error:`` line and exit status 1."""
    from kept_data import KeptDataError

    try:
        text = build()
    except KeptDataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(text)
    if not args.no_results:
        write_section(text, heading, Path(args.results))
    return 0


def add_output_options(parser: argparse.ArgumentParser) -> None:
    """The report options every benchmark with a RESULTS.md section shares: ``--report-only`` (rebuild the table and
    plot from finished runs), ``--no-results`` (print only) and ``--results`` (the file; its PNG goes next to it)."""
    parser.add_argument("--report-only", action="store_true", help="only rebuild the table and plot")
    parser.add_argument("--no-results", action="store_true", help="print only: write neither RESULTS.md nor the PNG")
    parser.add_argument(
        "--results",
        default=str(RESULTS),
        help="the RESULTS.md to write the section into (the PNG goes next to it)",
    )
