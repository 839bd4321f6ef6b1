"""Replay kept runs through the training-health alarms (verl_gigpo.rollout.health) offline, and print per run the
iteration at which validation success fell by half and the first iteration of each alarm, as a markdown table.

    python benchmarks/health_replay.py [kept files ...] [--set entropy_low=0.2 ...]
    python benchmarks/health_replay.py runs/demo                 # a run folder (its metrics.jsonl) or the file

Default files: benchmarks/data/collapse/*.jsonl.gz and benchmarks/data/collapse-verl/*/*.jsonl.gz.
docs/watching-a-run.md shows the table of the defaults.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]  # kept_data, verl_gigpo

from kept_data import read_kept  # noqa: E402

from verl_gigpo.rollout.health import SIGNALS, HealthOptions, replay, validation_fall  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
DEFAULT = ("collapse/*.jsonl.gz", "collapse-verl/*/*.jsonl.gz")


def kl_key(header: dict) -> str:
    """The KL metric the run's monitor read: ``actor/kl_loss`` when the run configured a KL loss."""
    overrides = header.get("overrides") or []
    overrides = overrides if isinstance(overrides, list) else [str(overrides)]
    return "actor/kl_loss" if any("use_kl_loss=true" in str(o).lower() for o in overrides) else "actor/ppo_kl"


def load(path: Path) -> tuple[dict, list[dict]]:
    """A kept file's (header, rows), or a run's metrics (``{}``, rows): a ``metrics.jsonl`` or a run folder holding one
    (the local engine's, or verl's under ``ckpt/``)."""
    if path.is_dir():
        found = [p for p in (path / "metrics.jsonl", path / "ckpt" / "metrics.jsonl") if p.is_file()]
        if not found:
            raise ValueError(f"{path}: no metrics.jsonl in this run folder (nor in its ckpt/)")
        path = found[0]
    if not path.is_file():
        raise ValueError(f"{path}: no such file (give kept .jsonl.gz files, metrics.jsonl files or run folders)")
    if path.name.endswith(".jsonl.gz"):
        return read_kept(path)
    return {}, [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def table(paths: list[Path], options: HealthOptions) -> list[str]:
    """Markdown lines: run, validation fall, then each alarm's first iterations (raised again after the cool-down)."""
    lines = ["| run | validation fell by half | alarms (first iterations) |", "|---|---|---|"]
    for path in paths:
        header, rows = load(path)
        monitor = replay(rows, options, kl_key=kl_key(header))
        first: dict[str, list[int]] = {}
        for alarm in monitor.alarms:
            first.setdefault(alarm.signal, []).append(alarm.iteration)
        alarms = "; ".join(
            f"`{s}` {', '.join(map(str, first[s][:3]))}{' ...' if len(first[s]) > 3 else ''}"
            for s in SIGNALS
            if s in first
        )
        fall = validation_fall(rows)
        name = str(path.resolve().relative_to(DATA) if path.resolve().is_relative_to(DATA) else path)
        name = name.removesuffix(".jsonl.gz")
        lines.append(f"| {name} | {fall if fall is not None else '-'} | {alarms or 'none'} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Print the table; ``--set key=value`` overrides a ``trainer.health`` option."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    try:
        section = {}
        for item in args.set:
            key, sep, value = item.partition("=")
            if not sep:
                raise ValueError(f"--set {item}: give KEY=VALUE, e.g. --set entropy_low=0.2")
            section[key] = int(value) if key in ("window", "baseline", "warmup", "cooldown") else float(value)
        options = HealthOptions.from_trainer({"health": section})
        paths = args.files or sorted(p for pattern in DEFAULT for p in DATA.glob(pattern))
        print("\n".join(table(paths, options)))
    except (ValueError, OSError) as error:  # a bad --set value or key, an unreadable file: one line
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
