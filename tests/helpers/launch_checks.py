"""What the e2e test files read from a finished launch of verl's pipeline (:class:`verl_gigpo.dev.smoke.RunResult`)."""

from __future__ import annotations

from typing import Any


def training_rows(run: Any) -> list[dict[str, Any]]:
    """The launch's logged rows of training iterations (those with ``actor/pg_loss``), in order."""
    return [m for m in run.metrics if "actor/pg_loss" in m]


def one_stop_line(run: Any, label: str) -> tuple[Any, str]:
    """The kill of ``label`` in ``run`` (it happened, and the launch stopped by itself) and the launch's only
    ``error:`` line."""
    kill = run.kill(label)
    assert kill is not None and kill.stopped_after_s is not None, (label, run.kills, run.output[-3000:])
    errors = run.error_lines()
    assert len(errors) == 1, errors
    return kill, errors[0]
