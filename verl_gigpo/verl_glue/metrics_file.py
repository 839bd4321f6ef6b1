"""The metrics file of a verl launch (``trainer.logger`` with ``file``): where it is, how it survives a resume, how
to read it.

``python -m verl_gigpo.main`` keeps one ``metrics.jsonl`` per experiment across launches (verl's logger would empty
it): :func:`prepare_metrics_file` trims it to the resumed checkpoint before Ray starts, :func:`append_file_logger`
makes verl append. :func:`read_metrics` reads it; :func:`iteration_gaps` finds missing or repeated iterations.
docs/runs.md ("Metrics").
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_gigpo import verl_logger

__all__ = [
    "APPEND_ENV",
    "METRICS_NAME",
    "MetricsPreparation",
    "append_file_logger",
    "format_steps",
    "iteration_gaps",
    "metrics_path",
    "prepare_metrics_file",
    "read_metrics",
    "superseded_path",
    "training_steps",
]

logger = verl_logger(__name__)

#: the metrics file's name in the experiment folder (``trainer.default_local_dir``)
METRICS_NAME = "metrics.jsonl"
#: set to ``1`` by ``python -m verl_gigpo.main`` for its launch: verl's file logger then appends
APPEND_ENV = "GIGPO_METRICS_APPEND"
#: the key verl logs with every training iteration (``PPOTrainer._compute_metrics``)
TRAINING_STEP_KEY = "training/global_step"


def metrics_path(config: Any, environ: dict[str, str] | None = None) -> Path | None:
    """Where verl's file logger of this launch writes, absolute: ``VERL_FILE_LOGGER_PATH``, else verl's
    ``VERL_FILE_LOGGER_ROOT`` rule, else ``<trainer.default_local_dir>/metrics.jsonl``; None without ``file``."""
    environ = os.environ if environ is None else environ
    loggers = config.trainer.get("logger", None) or []
    if "file" not in ([loggers] if isinstance(loggers, str) else list(loggers)):
        return None
    if environ.get("VERL_FILE_LOGGER_PATH"):
        return Path(environ["VERL_FILE_LOGGER_PATH"]).absolute()
    if environ.get("VERL_FILE_LOGGER_ROOT"):
        root = Path(os.path.expanduser(environ["VERL_FILE_LOGGER_ROOT"]))
        return (root / str(config.trainer.project_name) / f"{config.trainer.experiment_name}.jsonl").absolute()
    return Path(str(config.trainer.default_local_dir)).absolute() / METRICS_NAME


def superseded_path(path: Path) -> Path:
    """Where :func:`prepare_metrics_file` moves the rows a launch redoes: ``metrics.jsonl`` ->
    ``metrics.superseded.jsonl``."""
    return path.with_name(f"{path.stem}.superseded{path.suffix or '.jsonl'}")


@dataclass
class MetricsPreparation:
    """What :func:`prepare_metrics_file` did: rows kept, rows moved aside (with their steps), unreadable lines
    moved aside, and the iterations up to the resumed step that have no row."""

    path: Path
    kept: int = 0
    superseded_steps: list[int] = field(default_factory=list)
    unreadable: int = 0
    missing: list[int] = field(default_factory=list)

    def messages(self, resume_step: int) -> list[str]:
        """One line per thing the user should know (empty when the file simply continues or starts)."""
        lines = []
        moved = len(self.superseded_steps) + self.unreadable
        if moved:
            what = f"{len(self.superseded_steps)} row(s) of step(s) {format_steps(sorted(set(self.superseded_steps)))}"
            if self.unreadable:
                what += f" and {self.unreadable} unreadable line(s)"
            why = (
                f"logged after the checkpoint of step {resume_step}; this launch trains those iterations again"
                if resume_step
                else "of an earlier launch; this launch starts from scratch"
            )
            lines.append(f"metrics: moved {what} ({why}) to {superseded_path(self.path)}")
        if self.missing:
            lines.append(
                f"metrics: iteration(s) {format_steps(self.missing)} of the checkpointed run have no row in "
                f"{self.path}: the launch that trained them stopped before verl logged them (or logged without "
                "trainer.logger=file); their metrics are missing"
            )
        return lines


def prepare_metrics_file(path: Path, resume_step: int, *, keep_all: bool = False) -> MetricsPreparation:
    """Make ``path`` hold exactly the rows a launch that resumes after ``resume_step`` keeps (0: none): later rows and
    unreadable lines go to :func:`superseded_path`; iterations ``1..resume_step`` without a row are in ``missing``.
    ``keep_all`` (a ``trainer.val_only`` launch) leaves the file as it is. OSError when it cannot be read or written.
    """
    report = MetricsPreparation(path=path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if keep_all:
        report.kept = sum(1 for raw in path.read_bytes().splitlines() if raw.strip()) if path.exists() else 0
        return report
    if not path.exists():
        report.missing = list(range(1, resume_step + 1))
        return report
    raw_lines = path.read_bytes().splitlines(keepends=True)
    last_kept = resume_step if resume_step > 0 else -1  # a fresh start redoes the validation at step 0 too
    kept, moved = [], []
    present = set()
    for raw in raw_lines:
        if not raw.strip():
            continue
        record = _parse(raw)
        if record is None:
            report.unreadable += 1
            moved.append(raw)
        elif record["step"] > last_kept:
            report.superseded_steps.append(record["step"])
            moved.append(raw)
        else:
            kept.append(raw)
            if TRAINING_STEP_KEY in (record.get("data") or {}):
                present.add(record["step"])
    report.kept = len(kept)
    report.missing = [step for step in range(1, resume_step + 1) if step not in present]
    if moved:
        with superseded_path(path).open("ab") as out:
            out.writelines(line if line.endswith(b"\n") else line + b"\n" for line in moved)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(b"".join(kept))
        os.replace(tmp, path)
    return report


def _parse(raw: bytes) -> dict[str, Any] | None:
    """A verl file-logger line as a dict with an integer ``step``, or None when it is not one."""
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(record, dict) or isinstance(record.get("step"), bool) or not isinstance(record.get("step"), int):
        return None
    return record


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """verl's ``FileLogger`` lines (``{"step": k, "data": {...}}``) as ``[{"step": k, **data}, ...]`` in file order;
    ``[]`` when the file does not exist. Lines that are not such records are skipped with a warning."""
    path = Path(path)
    if not path.exists():
        return []
    rows, bad = [], 0
    for raw in path.read_bytes().splitlines():
        if not raw.strip():
            continue
        record = _parse(raw)
        if record is None:
            bad += 1
            continue
        rows.append({"step": record["step"], **(record.get("data") or {})})
    if bad:
        logger.warning("%s: skipped %d line(s) that are not verl file-logger records", path, bad)
    return rows


def training_steps(rows: Iterable[dict[str, Any]]) -> list[int]:
    """The steps of the training iterations among ``rows`` (rows holding ``training/global_step``), in order."""
    return [row["step"] for row in rows if TRAINING_STEP_KEY in row]


def iteration_gaps(rows: Sequence[dict[str, Any]]) -> tuple[list[int], list[int]]:
    """``(missing, repeated)``: the iterations ``1..last`` without a training row in ``rows``, and those with more
    than one."""
    steps = training_steps(rows)
    counts = Counter(steps)
    last = max(steps, default=0)
    return [s for s in range(1, last + 1) if s not in counts], sorted(s for s, n in counts.items() if n > 1)


def format_steps(steps: Sequence[int]) -> str:
    """``[1, 2, 3, 5]`` -> ``"1-3, 5"``."""
    parts: list[str] = []
    start = prev = None
    for step in sorted(steps):
        if prev is not None and step == prev + 1:
            prev = step
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = step
    if start is not None:
        parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ", ".join(parts)


def append_file_logger(_module: Any = None) -> None:
    """Make verl's ``FileLogger`` append (``"ab"``) to ``$VERL_FILE_LOGGER_PATH`` when ``GIGPO_METRICS_APPEND=1``:
    verl opens it with ``"wb"``, so a resumed launch would delete the earlier metrics. Idempotent.
    VerlMismatchError: verl's ``FileLogger`` differs from the contract's; RuntimeError: an unsupported verl."""
    from verl.utils import tracking

    from verl_gigpo.verl_glue.contract import check_signature
    from verl_gigpo.verl_glue.verl_version import VerlMismatchError, check_verl_version, installed_verl_version

    base = tracking.FileLogger
    if getattr(base, "_gigpo_append", False):
        return
    check_verl_version(installed_verl_version())
    use = "metrics-file append patch (verl_gigpo.verl_glue.metrics_file.append_file_logger)"
    if not isinstance(base, type) or not all(callable(getattr(base, name, None)) for name in ("log", "finish")):
        raise VerlMismatchError("verl.utils.tracking.FileLogger", "a class with log and finish", repr(base), use=use)
    check_signature(base, ("self", "project_name", "experiment_name"), target="verl.utils.tracking.FileLogger", use=use)

    class AppendingFileLogger(base):  # type: ignore[misc, valid-type]
        """verl's ``FileLogger`` that appends to ``$VERL_FILE_LOGGER_PATH`` when ``GIGPO_METRICS_APPEND=1``."""

        _gigpo_append = True

        def __init__(self, project_name: str, experiment_name: str) -> None:
            path = os.environ.get("VERL_FILE_LOGGER_PATH")
            if os.environ.get(APPEND_ENV) != "1" or not path:
                super().__init__(project_name, experiment_name)
                return
            self.project_name = project_name
            self.experiment_name = experiment_name
            self.filepath = path
            logger.info("file logger appending to %s", os.path.abspath(path))
            self.fp = open(path, "ab", buffering=0)  # noqa: SIM115 - verl's finish() closes it

    tracking.FileLogger = AppendingFileLogger
