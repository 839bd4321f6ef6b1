"""The evaluation table: success per task type with 95 % Wilson intervals, pass@k, and its plot.

    rows = success_rows(outcomes, k=4)          # one SuccessRow per task type, then "all"
    print(markdown_table(rows, k=4))
    plot_success(rows, "success_by_type.png")

Success rate = won / scored episodes; pass@k = tasks with a won episode among their k / scored tasks
(docs/evaluate.md, "The numbers").
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from verl_gigpo.rollout.transcripts import EpisodeOutcome

__all__ = ["Z_95", "SuccessRow", "markdown_table", "plot_success", "success_figure", "success_rows", "wilson_interval"]

#: the normal quantile of a two-sided 95 % interval
Z_95 = 1.959963984540054

#: the row of every task together
ALL = "all"


def wilson_interval(successes: int, trials: int, z: float = Z_95) -> tuple[float, float]:
    """The 95 % Wilson score interval ``(low, high)`` of ``p = successes / trials`` (z = 1.96); ``(0, 1)`` for none.

        centre = (p + z^2 / 2n) / (1 + z^2 / n),   half = z sqrt(p (1 - p) / n + z^2 / 4n^2) / (1 + z^2 / n)

    Raises:
        ValueError: ``successes`` outside ``[0, trials]``.
    """
    if not 0 <= successes <= trials:
        raise ValueError(f"successes={successes} must be in [0, trials={trials}]")
    if trials == 0:
        return 0.0, 1.0
    p, n = successes / trials, trials
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class SuccessRow:
    """The success of one task type (``"(none)"`` without one) or of every task (``"all"``).

    ``rate, low, high``: wins / episodes and its interval; ``pass_k, pass_low, pass_high``: solved / tasks and its
    interval; ``env_errors``: episodes whose environment failed (not scored).
    """

    name: str
    tasks: int
    episodes: int
    env_errors: int
    wins: int
    rate: float
    low: float
    high: float
    solved: int
    pass_k: float
    pass_low: float
    pass_high: float
    mean_length: float
    invalid_rate: float

    def as_dict(self) -> dict[str, Any]:
        """The row as a JSON-ready dict."""
        return asdict(self)


def success_rows(outcomes: Sequence[EpisodeOutcome]) -> list[SuccessRow]:
    """One :class:`SuccessRow` per task type (sorted), then ``"all"``; tasks told apart by episode group. ValueError:
    no episode."""
    if not outcomes:
        raise ValueError("no episode to score: the evaluation played nothing (no tasks in the split?)")
    types = sorted({_type_name(o.task_type) for o in outcomes})
    rows = [_row(name, [o for o in outcomes if _type_name(o.task_type) == name]) for name in types]
    return [*rows, _row(ALL, list(outcomes))]


def _row(name: str, outcomes: list[EpisodeOutcome]) -> SuccessRow:
    scored = [o for o in outcomes if not o.env_error]
    wins = sum(o.won for o in scored)
    by_task: dict[Any, bool] = {}
    for o in scored:
        by_task[o.group] = by_task.get(o.group, False) or o.won
    solved = sum(by_task.values())
    low, high = wilson_interval(wins, len(scored))
    pass_low, pass_high = wilson_interval(solved, len(by_task))
    steps = sum(o.length for o in scored)
    return SuccessRow(
        name=name,
        tasks=len(by_task),
        episodes=len(scored),
        env_errors=len(outcomes) - len(scored),
        wins=wins,
        rate=wins / len(scored) if scored else float("nan"),
        low=low,
        high=high,
        solved=solved,
        pass_k=solved / len(by_task) if by_task else float("nan"),
        pass_low=pass_low,
        pass_high=pass_high,
        mean_length=steps / len(scored) if scored else float("nan"),
        invalid_rate=sum(o.num_invalid for o in scored) / steps if steps else 0.0,
    )


def _type_name(task_type: Any) -> str:
    return "(none)" if task_type in (None, "") else str(task_type)


def markdown_table(rows: Sequence[SuccessRow], k: int) -> str:
    """The rows as a Markdown table: success with its 95 % interval, pass@k (when ``k`` > 1), episodes, lengths."""
    head = ["task type", "tasks", "episodes", "success", "95% CI"]
    if k > 1:
        head += [f"pass@{k}", "95% CI"]
    head += ["mean steps", "invalid replies", "env errors"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    for r in rows:
        cells = [
            f"**{r.name}**" if r.name == ALL else r.name,
            str(r.tasks),
            str(r.episodes),
            _pct(r.rate),
            f"{_pct(r.low)}-{_pct(r.high)}",
        ]
        if k > 1:
            cells += [_pct(r.pass_k), f"{_pct(r.pass_low)}-{_pct(r.pass_high)}"]
        cells += [f"{r.mean_length:.1f}", _pct(r.invalid_rate), str(r.env_errors)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:.1f}%"


def plot_success(rows: Sequence[SuccessRow], path: str | Path, *, title: str = "") -> Path:
    """A bar per row (success rate) with its 95 % interval as an error bar, written to ``path`` (PNG)."""
    import matplotlib.pyplot as plt

    fig = success_figure(rows, title=title)
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def success_figure(rows: Sequence[SuccessRow], *, title: str = "") -> Any:
    """The figure :func:`plot_success` writes; the title's lines are wrapped to the figure's width."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r.name for r in rows]
    rates = [0.0 if math.isnan(r.rate) else r.rate for r in rows]
    errors = [
        [max(0.0, v - r.low) for v, r in zip(rates, rows, strict=True)],
        [r.high - v for v, r in zip(rates, rows, strict=True)],
    ]
    fig, ax = plt.subplots(figsize=(max(4.0, 0.9 * len(rows) + 1.5), 3.6))
    colours = ["#4c72b0" if r.name != ALL else "#dd8452" for r in rows]
    ax.bar(range(len(rows)), rates, yerr=errors, capsize=4, color=colours)
    for i, r in enumerate(rows):
        ax.text(
            i, min(0.93, r.high + 0.02), f"{100 * rates[i]:.0f}%\nn={r.episodes}", ha="center", va="bottom", fontsize=8
        )
    ax.set_xticks(
        range(len(rows)), names, rotation=30 if len(rows) > 4 else 0, ha="right" if len(rows) > 4 else "center"
    )
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("success rate (95% CI)")
    width = int(fig.get_figwidth() * 72 / (10 * 0.62)) - 2  # characters of 10 pt text across the figure
    lines = (title or "success per task type").splitlines()
    ax.set_title("\n".join(textwrap.fill(line, width) for line in lines), fontsize=10)
    fig.tight_layout()
    return fig
