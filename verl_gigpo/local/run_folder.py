"""The local engine's run folder: what a run writes there (:data:`RUN_OUTPUTS`), how a run is protected from being
overwritten by accident (``--resume`` / ``--overwrite``), atomic checkpoint pointers, and how checkpoints are found
on resume. The rules: docs/runs.md ("The local engine's run folder") and docs/local-engine.md.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path

from verl_gigpo.config.resume import POINTER

__all__ = [
    "RUN_OUTPUTS",
    "check_writable",
    "checkpoint_candidates",
    "prepare_run_folder",
    "write_latest",
]

logger = logging.getLogger(__name__)

RUN_OUTPUTS = ("metrics.jsonl", "learning_curve.png", "checkpoints", "credit", "episodes.jsonl", "episodes.html")
"""What a run writes in its folder (and all that ``--overwrite`` removes)."""

_ITER = re.compile(r"iter_(\d+)")


def prepare_run_folder(out_dir: str | Path, *, resume: bool, overwrite: bool) -> None:
    """Make sure starting (or resuming) a run in ``out_dir`` destroys nothing by accident, then :func:`check_writable`.

    Without ``resume``, a folder holding a run is refused unless ``overwrite`` (which deletes only :data:`RUN_OUTPUTS`).

    Raises:
        ValueError: a run is there and neither flag is given, both flags are given, or a path cannot be written.
    """
    out = Path(out_dir)
    if resume and overwrite:
        raise ValueError("--resume and --overwrite contradict each other: continue the run in the folder, or delete it")
    found = [name for name in RUN_OUTPUTS if (out / name).exists()]
    if resume or not found:
        check_writable(out)
        return
    if not overwrite:
        metrics = out / "metrics.jsonl"
        lines = len(metrics.read_text().splitlines()) if metrics.is_file() else 0
        saved = sorted(int(m.group(1)) for p in (out / "checkpoints").glob("iter_*") if (m := _ITER.fullmatch(p.name)))
        raise ValueError(
            f"{out} already holds a run ({', '.join(found)}; {lines} metrics line(s), checkpoints of iterations "
            f"{saved or 'none'}). Pass --resume (trainer.resume=true) to continue it, --overwrite "
            "(trainer.overwrite=true) to delete it and start over, or choose another trainer.default_local_dir"
        )
    for name in found:
        path = out / name
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError as exc:
            raise ValueError(_cannot("delete", exc, path, out)) from None
    logger.warning("trainer.overwrite: deleted the previous run's %s in %s", ", ".join(found), out)
    check_writable(out)


def _cannot(what: str, exc: OSError, path: Path, out: Path) -> str:
    """One line: what could not be done to which path, why, and what to do."""
    return (
        f"cannot {what} {path}: {exc.strerror or exc} (run folder trainer.default_local_dir={out}); make it "
        "writable or choose another trainer.default_local_dir"
    )


def check_writable(out_dir: str | Path) -> None:
    """Create ``out_dir`` if needed and check that a run can write there (files, ``checkpoints/``, ``credit/``,
    ``metrics.jsonl``) without changing anything; ValueError: one line naming the path and why."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # the folder itself or the first parent that could not be made
        raise ValueError(_cannot("create", exc, Path(exc.filename or out), out)) from None
    for folder in (out, out / "checkpoints", out / "credit"):
        if folder.is_dir():
            probe = folder / f".write-test-{os.getpid()}"
            try:
                probe.touch()
                probe.unlink()
            except OSError as exc:
                raise ValueError(_cannot("write in", exc, folder, out)) from None
    for name in ("metrics.jsonl", "learning_curve.png"):
        path = out / name
        if path.exists() or path.is_symlink():
            try:
                with path.open("a"):
                    pass
            except OSError as exc:
                raise ValueError(_cannot("write", exc, path, out)) from None


def write_latest(checkpoints: str | Path, iteration: int) -> None:
    """Point ``checkpoints/latest_checkpointed_iteration.txt`` at ``iteration`` atomically (temp file, rename)."""
    checkpoints = Path(checkpoints)
    tmp = checkpoints / (POINTER + ".tmp")
    with tmp.open("w") as fh:
        fh.write(f"{iteration}\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, checkpoints / POINTER)


def checkpoint_candidates(checkpoints: str | Path) -> list[tuple[int, Path]]:
    """``(iteration, state.pt path)`` to try on resume, best first: the pointer's, then every other complete one,
    newest first; warns when the pointer is missing, unreadable or names a partial checkpoint."""
    checkpoints = Path(checkpoints)
    complete = sorted(
        (
            (int(m.group(1)), p / "state.pt")
            for p in checkpoints.glob("iter_*")
            if (m := _ITER.fullmatch(p.name)) and (p / "state.pt").is_file()
        ),
        reverse=True,
    )
    pointer = checkpoints / POINTER
    named: int | None = None
    problem = ""
    try:
        named = int(pointer.read_text().strip())
    except FileNotFoundError:
        problem = f"{pointer} is missing"
    except (OSError, ValueError) as exc:
        problem = f"{pointer} is unreadable ({exc})"
    if named is not None and all(it != named for it, _ in complete):
        problem = f"{pointer} names iteration {named}, whose checkpoint is missing or partial"
        named = None
    if problem and complete:
        logger.warning("%s; resuming from the newest complete checkpoint, iteration %d", problem, complete[0][0])
    first = [c for c in complete if c[0] == named]
    return first + [c for c in complete if c[0] != named]
