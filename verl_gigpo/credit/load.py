"""Find and read the credit records of a run (``<run dir>/credit/iter_<k>.jsonl``, see :mod:`verl_gigpo.credit`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_gigpo.credit.records import CREDIT_DIR, read_credit_records

__all__ = ["CreditRun", "CreditReportError", "load_credit_run"]

_ITER_FILE = re.compile(r"^iter_(\d+)\.jsonl$")


class CreditReportError(ValueError):
    """The input of the credit report is not usable; the message says what is wrong and what to do."""


@dataclass
class CreditRun:
    """The credit records of a run (or of one file).

    Attributes:
        source: the folder (or file) the records were read from.
        records: ``{iteration: [record, ...]}``, iterations ascending, each list in file order.
    """

    source: Path
    records: dict[int, list[dict[str, Any]]]

    @property
    def iterations(self) -> list[int]:
        """The logged iterations, ascending."""
        return sorted(self.records)

    def all_records(self) -> list[dict[str, Any]]:
        """Every record of every iteration, iteration by iteration."""
        return [r for k in self.iterations for r in self.records[k]]

    def groups(self, iteration: int) -> list[str]:
        """The episode groups of ``iteration`` as strings, in file order."""
        return list(dict.fromkeys(str(r["group"]) for r in self.records[iteration]))

    def group_records(self, iteration: int, group: str) -> list[dict[str, Any]]:
        """The records of episode group ``group`` (compared as a string) in ``iteration``.

        Raises:
            CreditReportError: no such iteration, or no such group in it (the message lists the ones there are).
        """
        if iteration not in self.records:
            raise CreditReportError(
                f"iteration {iteration} has no credit records in {self.source}; logged iterations: "
                f"{_short_list(self.iterations)}"
            )
        rows = [r for r in self.records[iteration] if str(r["group"]) == str(group)]
        if not rows:
            raise CreditReportError(
                f"episode group {group!r} is not in the credit records of iteration {iteration} ({self.source}); "
                f"groups there: {_short_list(self.groups(iteration))} (only trainer.credit_log_groups sampled "
                "groups are written; -1 writes all)"
            )
        return rows


def load_credit_run(path: str | Path) -> CreditRun:
    """Read the credit records at ``path``: a run directory (holding ``credit/``), a ``credit/`` folder, or one
    ``iter_<k>.jsonl`` file.

    Raises:
        CreditReportError: the path does not exist, holds no credit files, or a file is empty or malformed.
    """
    path = Path(path)
    if not path.exists():
        raise CreditReportError(
            f"{path} does not exist; pass a run directory (trainer.default_local_dir of a run with "
            "trainer.credit_log_freq > 0), its credit/ folder, or one credit/iter_<k>.jsonl file"
        )
    if path.is_file():
        rows = _read(path)
        if not rows:
            raise CreditReportError(f"{path} holds no credit records")
        records: dict[int, list[dict[str, Any]]] = {}
        for row in rows:  # one file normally holds one iteration; group by the records' own field
            records.setdefault(int(row["iteration"]), []).append(row)
        return CreditRun(source=path, records=dict(sorted(records.items())))
    folder = path / CREDIT_DIR if (path / CREDIT_DIR).is_dir() else path
    files = {int(m.group(1)): p for p in folder.iterdir() if (m := _ITER_FILE.match(p.name)) and p.is_file()}
    if not files:
        raise CreditReportError(
            f"no credit records in {path} (looked for {folder}/iter_<k>.jsonl); train with "
            "trainer.credit_log_freq=N (N > 0) to write them every N iterations"
        )
    records = {k: rows for k, file in sorted(files.items()) if (rows := _read(file))}
    if not records:
        raise CreditReportError(
            f"the credit files in {folder} hold no records (every sampled episode group failed, or the files are empty)"
        )
    return CreditRun(source=path, records=records)


def _read(file: Path) -> list[dict[str, Any]]:
    try:
        return read_credit_records(file)
    except ValueError as exc:
        raise CreditReportError(str(exc)) from exc


def _short_list(items: list[Any], limit: int = 20) -> str:
    shown = ", ".join(str(x) for x in items[:limit])
    return shown + (f", ... ({len(items)} in all)" if len(items) > limit else "")
