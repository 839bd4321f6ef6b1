"""The few lines a launch ends with, on both engines: iterations done, the last validation per task type with
counts, the health alarms raised, the checkpoint written and the commands that evaluate and export it.

    print("\\n".join(launch_summary(rows, run_dir=out, checkpoint=ckpt)))

``rows`` are the run's metrics lines (the local engine's history, verl's metrics file).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["HEALTH_JSONL", "health_lines", "last_validation", "launch_summary", "validation_lines"]

#: the health alarms file of a run folder (one JSON object per alarm)
HEALTH_JSONL = "health.jsonl"

_TYPE_KEY = re.compile(r"val-core/[^/]+/(?P<type>[^/]+)/success")
_CORE_ACC = re.compile(r"val-core/[^/]+/acc/mean@\d+")


def last_validation(rows: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The last metrics line that holds a validation (``val/success_rate`` or a ``val-core/*`` key), or None."""
    for row in reversed(rows):
        if any(key == "val/success_rate" or key.startswith("val-core/") for key in row):
            return row
    return None


def _count(rate: float, n: float) -> str:
    return f"{round(float(rate) * float(n))}/{int(n)}"


def validation_lines(row: Mapping[str, Any]) -> list[str]:
    """The validation of one metrics line as ``type won/played`` items: per type from ``val-core/<env>/<T>/success``
    and ``.../count``; else the local engine's ``val/success_rate`` with ``val/num_trajectories`` (and its per-type
    rates); else verl's ``val-core/<env>/acc/mean@N`` rate."""
    per_type = {}
    for key, value in row.items():
        match = _TYPE_KEY.fullmatch(key)
        count = row.get(key[: -len("success")] + "count") if match else None
        if match and count is not None:
            per_type[match["type"]] = _count(value, count)
    if per_type:
        won = sum(int(v.split("/")[0]) for v in per_type.values())
        played = sum(int(v.split("/")[1]) for v in per_type.values())
        return [f"all {won}/{played}", *(f"{t} {v}" for t, v in sorted(per_type.items()))]
    if "val/success_rate" in row:
        n = row.get("val/num_trajectories")
        total = _count(row["val/success_rate"], n) if n else f"{row['val/success_rate']:.3f}"
        types = sorted(k for k in row if k.startswith("val/success_rate/"))
        return [f"all {total}", *(f"{k.rsplit('/', 1)[1]} {row[k]:.3f}" for k in types)]
    return [f"{key} {value:.3f}" for key, value in row.items() if _CORE_ACC.fullmatch(key)]


def health_lines(run_dir: str | Path) -> list[str]:
    """One line per alarm of ``<run_dir>/health.jsonl`` (its ``message``, with the iteration when given);
    ``["none (no health.jsonl in the run folder)"]`` without the file (no alarm, or the checks off). Lines that are
    not JSON are shown as they are."""
    path = Path(run_dir) / HEALTH_JSONL
    if not path.is_file():
        return ["none (no health.jsonl in the run folder)"]
    lines = []
    for text in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError:
            lines.append(text.strip())
            continue
        if not isinstance(record, dict):
            lines.append(text.strip())
            continue
        message = record.get("message") or json.dumps(record)
        iteration = record.get("iteration")
        lines.append(f"iteration {iteration}: {message}" if iteration is not None else str(message))
    return lines or ["none raised"]


def launch_summary(
    rows: Sequence[Mapping[str, Any]],
    *,
    run_dir: str | Path,
    iterations: int | None,
    checkpoint: str | Path | None,
    evaluate: Sequence[str] | None = None,
    export: Sequence[str] | None = None,
) -> list[str]:
    """The end-of-launch lines (module docstring). ``evaluate`` / ``export``: the command lines to show (default
    ``python -m verl_gigpo.evaluate CHECKPOINT`` and ``python -m verl_gigpo.export CHECKPOINT --out exported/NAME``)."""
    lines = ["=== run summary ===", f"iterations done: {iterations if iterations is not None else 'unknown'}"]
    val = last_validation(rows)
    if val is None:
        lines.append("last validation: none")
    else:
        step = val.get("training_step", val.get("step"))
        where = f" (iteration {int(step)})" if step is not None else ""
        lines.append(f"last validation{where}: " + ", ".join(validation_lines(val)))
    alarms = health_lines(run_dir)
    if (
        any("timing_s/step" in r for r in rows)  # a training iteration was logged (validation-only rows have none)
        and not (Path(run_dir) / HEALTH_JSONL).is_file()
        and not any(k.startswith("health/") for r in rows for k in r)
    ):
        alarms = ["not checked (no health/* metrics logged: trainer.health.enable=false)"]
    lines.append(f"health alarms: {alarms[0]}" if len(alarms) == 1 else "health alarms:")
    if len(alarms) > 1:
        lines += [f"  {a}" for a in alarms]
    if checkpoint is None:
        lines.append("checkpoint: none written")
        return lines
    ckpt = str(checkpoint)
    lines.append(f"checkpoint: {ckpt}")
    name = Path(ckpt).name if not Path(ckpt).name.startswith(("global_step_", "iter_")) else Path(ckpt).parent.name
    evaluate = evaluate or ["python", "-m", "verl_gigpo.evaluate", ckpt]
    export = export or ["python", "-m", "verl_gigpo.export", ckpt, "--out", f"exported/{name}"]
    lines.append(f"evaluate: {shlex.join(evaluate)}")
    lines.append(f"export:   {shlex.join(export)}")
    return lines
