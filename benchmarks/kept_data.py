"""Kept data: each finished benchmark run's metric rows, command, commit and config in one small versioned file under
``benchmarks/data/`` (committed), so ``--report-only`` rebuilds a RESULTS.md section in a fresh clone.

Format and size budget: ``docs/benchmarks.md`` ("Kept data").
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "benchmarks" / "data"
FORMAT = "verl-gigpo-kept-run"
VERSION = 1
#: what every file under ``benchmarks/data/`` may hold together (checked by tests/test_kept_data.py)
BUDGET_BYTES = 6_000_000
#: significant digits a float keeps (float32's precision; the reports print 2 decimals)
DIGITS = 7
NO_KEPT_DATA = "no kept data"
#: benchmark options that change what a table shows: a report refuses kept files made with other values
REPORT_KEYS = ("task", "model", "iters", "tasks", "group", "opt_steps", "val_size", "test_freq", "max_rounds")


class KeptDataError(ValueError):
    """A kept file that cannot serve the run or report asked for (other format version, other settings)."""


def refused_in_one_line(run: Callable[[], int]) -> int:
    """``run()``'s exit status, or 2 after one ``error:`` line when it refuses a kept file (:class:`KeptDataError`:
    another format version, or other settings than the command asks)."""
    try:
        return run()
    except KeptDataError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


def default_data_dir(runs: str | Path) -> Path:
    """The kept-data folder of a benchmark whose runs go to ``runs``: ``benchmarks/data/<name of runs>``."""
    return DATA / Path(runs).name


def kept_file(data_dir: str | Path, label: str, seed: int) -> Path:
    """The kept file of one (configuration, seed): ``<data_dir>/<label>-seed<seed>.jsonl.gz`` (label ``gigpo`` or
    ``verl/gigpo``)."""
    return Path(data_dir) / f"{label}-seed{seed}.jsonl.gz"


def shown(path: str | Path) -> str:
    """``path`` relative to the repository when inside it (as RESULTS.md names it), else as given."""
    path = Path(path).resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def _scalar(value: Any) -> Any:
    """A JSON scalar kept as it is, floats to :data:`DIGITS` significant digits (nan and inf kept); None for
    anything else (lists, dicts, None)."""
    if isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if not math.isfinite(value) else float(f"{value:.{DIGITS}g}")
    return None


def scalar_row(row: dict[str, Any]) -> dict[str, Any]:
    """Every scalar key of a metric row (non-scalars dropped), floats rounded (:func:`_scalar`)."""
    out = {k: _scalar(v) for k, v in row.items()}
    return {k: v for k, v in out.items() if v is not None}


def git_commit() -> str:
    """The repository's commit (``-dirty`` when tracked files differ from it), or ``unknown`` outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def _jsonable(value: Any) -> Any:
    return value if isinstance(value, bool | int | float | str | type(None)) else str(value)


def write_kept(
    path: str | Path,
    rows: Iterable[dict[str, Any]],
    *,
    overrides: list[str],
    args: dict[str, Any],
    command: str | None = None,
    launch: dict[str, Any] | None = None,
) -> Path:
    """Write one run's kept file: a header line (format, version, command, commit, the benchmark's arguments, the
    run's overrides, ``launch``: the verl launch's ``wall_s``/``returncode``), then one line per metric row
    (:func:`scalar_row`). Written atomically: an interrupted write leaves no file."""
    path = Path(path)
    header = {
        "format": FORMAT,
        "version": VERSION,
        "command": command or " ".join(["python", *sys.argv]),
        "commit": git_commit(),
        "written": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "args": {k: _jsonable(v) for k, v in args.items()},
        "overrides": list(overrides),
        "launch": launch,
    }
    lines = [json.dumps(header), *(json.dumps(scalar_row(r)) for r in rows)]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0) as f:
        f.write(("\n".join(lines) + "\n").encode())
    os.replace(tmp, path)
    return path


def read_kept(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One kept file: ``(header, rows)``. A file of another format or version is refused naming both."""
    with gzip.open(path, "rt") as f:
        lines = [json.loads(x) for x in f if x.strip()]
    header = lines[0] if lines else {}
    if header.get("format") != FORMAT or header.get("version") != VERSION:
        raise KeptDataError(
            f"{path}: kept-data format {header.get('format')!r} version {header.get('version')!r}; this code reads "
            f"{FORMAT!r} version {VERSION}: check out the commit named in the file's header"
        )
    return header, lines[1:]


def check_args(path: str | Path, header: dict[str, Any], args: Any) -> None:
    """Refuse (:class:`KeptDataError`) a kept file whose benchmark options differ from ``args`` on
    :data:`REPORT_KEYS`, naming the option, both values and the command that made the file."""
    for key in REPORT_KEYS:
        if key in header["args"] and hasattr(args, key) and header["args"][key] != _jsonable(getattr(args, key)):
            raise KeptDataError(
                f"{path}: kept with --{key.replace('_', '-')} {header['args'][key]}, this report asks "
                f"{getattr(args, key)}: give the options of the command that made it ({header['command']})"
            )


def total_bytes(root: str | Path = DATA) -> int:
    """Bytes of every file under ``root`` (0 when it does not exist)."""
    return sum(p.stat().st_size for p in Path(root).rglob("*") if p.is_file())


def add_kept_options(parser: argparse.ArgumentParser) -> None:
    """``--data`` (the kept-data folder; default ``benchmarks/data/<name of --runs>``) and ``--rerun`` (run cells
    whose kept data exist too, replacing them)."""
    parser.add_argument("--data", default=None, help="kept-data folder (default benchmarks/data/<name of --runs>)")
    parser.add_argument("--rerun", action="store_true", help="re-run (configuration, seed) cells already kept")


def run_missing_cells(
    labels: list[str], seeds: list[int], args: argparse.Namespace, run: Callable[[str, int, argparse.Namespace], str]
) -> None:
    """Run ``run(label, seed, args)`` (it returns one line to print) for each (label, seed) cell without a kept file
    under ``args.data`` (every cell with ``args.rerun``), ``args.jobs`` at a time."""
    todo = [(c, s) for c in labels for s in seeds if args.rerun or not kept_file(args.data, c, s).exists()]
    print(f"{len(todo)} cell(s) to run, {args.jobs} at a time", flush=True)
    with ThreadPoolExecutor(args.jobs) as pool:
        for line in pool.map(lambda cell: run(*cell, args), todo):
            print(line, flush=True)
