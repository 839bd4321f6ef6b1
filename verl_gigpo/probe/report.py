"""The probe's summary: the table (printed and ``table.md``), ``summary.json``, a bar chart and one HTML page.

paths = write_report(result, "runs/probe/gridnav", command="python -m verl_gigpo.probe --env gridnav")
"""

from __future__ import annotations

import base64
import html
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from verl_gigpo.probe.run import ProbeResult
from verl_gigpo.probe.stats import percent

__all__ = ["COLUMNS", "TABLE_COLUMNS", "ProbeReport", "headline", "markdown_table", "plot_probe", "write_report"]

#: the table's columns after the key mode (definitions: :mod:`verl_gigpo.probe.stats`)
COLUMNS = (
    "anchor groups / episode group",
    "shared groups (>= 2 rows) / episode group",
    "rows alone in their anchor group",
    "rows with a step signal",
    "rows grouped with another state",
    "episode groups with step signal only",
)

#: the probe's own table: :data:`COLUMNS` and the signal-only groups with the per-step reward taken off
TABLE_COLUMNS = (*COLUMNS, "the same without the per-step reward")


def _cells(stats: Any) -> list[str]:
    """One key mode's row of the table: its key, then the :data:`TABLE_COLUMNS` values as printed."""
    return [
        stats.key,
        f"{stats.anchor_groups_per_group:.1f}",
        f"{stats.shared_groups_per_group:.1f}",
        percent(stats.singleton_rows),
        percent(stats.signal_rows),
        percent(stats.merged_rows),
        percent(stats.signal_only_groups),
        f"{percent(stats.signal_only_groups_no_step_reward)} (c = {stats.step_reward:g})",
    ]


SUMMARY_JSON = "summary.json"
TABLE_MD = "table.md"
PLOT_PNG = "probe.png"
HTML_PAGE = "probe.html"


@dataclass(frozen=True)
class ProbeReport:
    """The files :func:`write_report` wrote."""

    out: Path
    summary: Path
    table: Path
    plot: Path
    html: Path


def headline(result: ProbeResult) -> str:
    """Two lines over the table: what was played, and what the episodes were like."""
    opts = result.options
    flat = result.stats[0].flat_groups if result.stats else 0.0
    failed = f", {result.failed} failed in the environment (left out)" if result.failed else ""
    return (
        f"{opts.env} ({result.split}, max_steps {result.max_steps}): {opts.groups} episode groups x {opts.n} "
        f"episodes, {result.policy}; step term of {opts.method} (gamma {opts.gamma:g})\n"
        f"{result.rows} step rows; mean length {result.mean_length:.1f}; success {percent(result.success)}; invalid "
        f"actions {percent(result.invalid)}; episode groups with equal returns (an episode filter drops them): "
        f"{percent(flat)}{failed}"
    )


def markdown_table(result: ProbeResult) -> str:
    """One row per key mode: the columns of :data:`TABLE_COLUMNS`."""
    lines = ["| key mode | " + " | ".join(TABLE_COLUMNS) + " |", "|---" * (len(TABLE_COLUMNS) + 1) + "|"]
    for s in result.stats:
        key, *rest = _cells(s)
        lines.append("| " + " | ".join([f"`{key}`", *rest]) + " |")
    return "\n".join(lines)


def plot_probe(result: ProbeResult, path: str | Path) -> Path:
    """Horizontal bars per key mode: singleton rows, signal rows, signal-only groups (fractions in [0, 1])."""
    stats = result.stats
    series = (
        ("rows alone in their anchor group", [s.singleton_rows for s in stats], "#c44e52"),
        ("rows with a step signal", [s.signal_rows for s in stats], "#4c72b0"),
        ("rows grouped with another state", [s.merged_rows for s in stats], "#dd8452"),
        ("episode groups with step signal only", [s.signal_only_groups for s in stats], "#55a868"),
        ("the same without the per-step reward", [s.signal_only_groups_no_step_reward for s in stats], "#8172b3"),
    )
    fig = Figure(figsize=(9, 2.2 + 0.75 * len(stats)), dpi=100, layout="constrained")
    ax = fig.subplots()
    y = np.arange(len(stats))  # (K,)
    height = 0.2
    for i, (label, values, colour) in enumerate(series):
        ax.barh(y + (i - 1.5) * height, values, height=height, label=label, color=colour)
    ax.set_yticks(y, [s.key for s in stats])
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("fraction")
    ax.grid(axis="x", alpha=0.3)
    fig.legend(fontsize=8, loc="outside lower center", ncol=2)
    opts = result.options
    verdict = {
        "recommend": f"recommended key mode: {result.recommendation.key}",
        "fragmented": f"anchor groups hardly form (even with {result.recommendation.key})",
        "no_signal": "no key mode gives a step signal",
    }[result.recommendation.verdict]
    ax.set_title(f"{opts.env}: {opts.groups} groups x {opts.n} episodes, {result.policy}\n{verdict}", fontsize=9)
    path = Path(path)
    fig.savefig(path)
    return path


def write_report(result: ProbeResult, out: str | Path, *, command: str | None = None) -> ProbeReport:
    """Write ``summary.json``, ``table.md``, ``probe.png`` and ``probe.html`` (the PNG inlined) into ``out``.

    ``command``: the command line that made it, kept in the summary and shown on the page.

    Raises:
        ValueError: ``out`` already holds a probe summary (choose another folder, or remove it).
    """
    out = Path(out)
    if (out / SUMMARY_JSON).exists():
        raise ValueError(f"--out {out}: already holds a probe summary; choose another folder, or remove it first")
    out.mkdir(parents=True, exist_ok=True)
    head, table, line = headline(result), markdown_table(result), result.recommendation.line
    summary = out / SUMMARY_JSON
    summary.write_text(json.dumps({"command": command, **result.as_dict()}, indent=2) + "\n")
    table_md = out / TABLE_MD
    shown = f"`{command}`\n\n" if command else ""
    table_md.write_text(f"{shown}{head}\n\n{table}\n\n{line}\n")
    plot = plot_probe(result, out / PLOT_PNG)
    page = out / HTML_PAGE
    page.write_text(_html(result, head, line, command, plot), encoding="utf-8")
    return ProbeReport(out=out, summary=summary, table=table_md, plot=plot, html=page)


def _html(result: ProbeResult, head: str, line: str, command: str | None, plot: Path) -> str:
    """One self-contained page: the command, the headline, the recommendation, the table and the chart."""
    image = base64.b64encode(plot.read_bytes()).decode("ascii")
    header = "".join(f"<th>{html.escape(c)}</th>" for c in ("key mode", *TABLE_COLUMNS))
    rows = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in _cells(s)) + "</tr>" for s in result.stats)
    shown = f"<pre>{html.escape(command)}</pre>" if command else ""
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>step-credit probe: {html.escape(result.options.env)}</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:auto;padding:1em}} pre{{background:#f6f6f6;padding:.6em;
white-space:pre-wrap}} table{{border-collapse:collapse;font-size:14px}} td,th{{border:1px solid #ccc;padding:3px 8px;
text-align:left}}</style></head><body>
<h1>Will step credit help here?</h1>
{shown}<pre>{html.escape(head)}</pre>
<p><b>{html.escape(line)}</b></p>
<table><tr>{header}</tr>{rows}</table>
<p><img alt="{PLOT_PNG}" src="data:image/png;base64,{image}" style="max-width:100%"></p>
</body></html>
"""
