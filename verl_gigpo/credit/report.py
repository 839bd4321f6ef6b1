"""The credit report: the anchor-state graph of one group (beside another run's, with ``compare``), run-level
distributions, a summary, one HTML page."""

from __future__ import annotations

import base64
import html
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from verl_gigpo.config.rules import DEFAULT_GAMMA
from verl_gigpo.credit.graph import STEP_TERMS, anchor_graph, draw_anchor_graph, draw_side_by_side
from verl_gigpo.credit.load import CreditRun, load_credit_run
from verl_gigpo.credit.recredit import recredit
from verl_gigpo.credit.stats import ZERO, RunStats, credit_pairs, run_stats, summary_text
from verl_gigpo.rollout.episode_log import PAGE_STYLE, sign_colour

__all__ = ["CreditReport", "default_group", "make_report", "plot_distributions"]

#: file names inside the report folder
DISTRIBUTIONS_PNG = "credit_distributions.png"
HTML_PAGE = "credit_report.html"
SUMMARY_TXT = "credit_summary.txt"
#: a step's observation image in the trajectories table: drawn small, pixels kept sharp
STEP_IMAGE_STYLE = "height:48px;image-rendering:pixelated;vertical-align:middle;margin:0 2px"


@dataclass
class CreditReport:
    """What :func:`make_report` wrote, and the summary it printed."""

    iteration: int
    group: str
    graph_png: Path
    distributions_png: Path
    html: Path
    summary_txt: Path
    summary: str
    compare_png: Path | None = None
    methods_png: Path | None = None

    def files(self) -> dict[str, Path]:
        """Every file of the report but the summary text, by what it shows."""
        optional = {"side by side": self.compare_png, "every method": self.methods_png}
        written = {label: path for label, path in optional.items() if path is not None}
        return {"graph": self.graph_png, **written, "distributions": self.distributions_png, "report": self.html}


def default_group(run: CreditRun, iteration: int) -> str:
    """The episode group of ``iteration`` with the most rows that got a nonzero step advantage (the most to see in
    its graph); ties go to the first in the file."""
    counts: dict[str, int] = defaultdict(int)
    for r in run.records[iteration]:
        counts[str(r["group"])] += int(abs(r["step_adv"]) > ZERO)
    groups = run.groups(iteration)
    return max(groups, key=lambda g: (counts[g], -groups.index(g)))


def plot_distributions(stats: RunStats, path: str | Path) -> Path:
    """Four panels over the run: anchor-group sizes; rows in singleton anchor groups per iteration; A_E vs A_S;
    how often A_E and A_S disagree in sign per iteration."""
    fig = Figure(figsize=(12, 8.5), dpi=100)
    (ax1, ax2), (ax3, ax4) = fig.subplots(2, 2)
    sizes = stats.anchor_group_sizes
    bins = np.arange(0.5, sizes.max() + 1.5, 1.0) if sizes.max() <= 60 else 40
    ax1.hist(sizes, bins=bins, color="#4c72b0")
    ax1.set(xlabel="anchor-group size (rows)", ylabel="anchor groups", title="anchor-group sizes (size 1: A_S = 0)")

    its = stats.iterations
    ax2.plot(its, [stats.singleton_row_frac[k] for k in its], "o-", color="#c44e52")
    ax2.set(
        xlabel="iteration",
        ylabel="fraction of rows",
        ylim=(-0.02, 1.02),
        title="rows alone in their anchor group (no step signal)",
    )

    order = np.argsort(stats.row_iteration, kind="stable")
    points = ax3.scatter(
        stats.episode_adv[order], stats.step_adv[order], c=stats.row_iteration[order], s=9, alpha=0.5, cmap="viridis"
    )
    ax3.axhline(0, color="#999999", lw=0.8)
    ax3.axvline(0, color="#999999", lw=0.8)
    ax3.set(
        xlabel="episode advantage A_E",
        ylabel="step advantage A_S",
        title="A_E vs A_S per step row (upper-left, lower-right: disagree)",
    )
    if len(its) > 1:
        fig.colorbar(points, ax=ax3, label="iteration")

    ax4.plot(
        its, [stats.disagree_frac[k] for k in its], "o-", color="#8172b2", label="opposite signs (of rows with both)"
    )
    ax4.plot(its, [stats.both_nonzero_frac[k] for k in its], "s--", color="#55a868", label="rows with both nonzero")
    ax4.set(xlabel="iteration", ylabel="fraction", ylim=(-0.02, 1.02), title="do the two terms disagree?")
    ax4.legend(fontsize=8, loc="best")
    for ax in (ax1, ax2, ax3, ax4):
        ax.grid(alpha=0.3)
    for ax in (ax1, ax2, ax4):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.suptitle(f"credit over the run: {stats.rows} step rows of {stats.episode_groups} sampled episode groups")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    return path


def make_report(
    source: str | Path,
    *,
    iteration: int | None = None,
    group: str | None = None,
    out_dir: str | Path | None = None,
    compare: str | Path | None = None,
    methods: Sequence[str] = (),
    gamma: float = DEFAULT_GAMMA,
) -> CreditReport:
    """Read the credit records at ``source`` and write the report (PNGs, HTML page, summary text).

    Args:
        source: a run directory, its ``credit/`` folder, or one ``iter_<k>.jsonl`` file.
        iteration: the iteration whose group is drawn (default: the last logged one).
        group: the episode group drawn (default: :func:`default_group`).
        out_dir: where the files go (default: ``report/`` next to the credit files).
        compare: another run's records (same forms as ``source``): its credit for the same iteration and episode
            group is drawn beside this run's on one colour scale (``credit_compare_iter<K>_group<ID>.png``). Two
            runs with the same ``trainer.seed`` play the same tasks; at iteration 1 (before any update) the local
            engine's runs also play the same episodes, so the picture shows two methods crediting the same moves.
        methods: step-credit estimators to credit the drawn group's rows again with (:func:`.recredit.recredit`,
            their default options and ``gamma``), drawn two per row on one colour scale
            (``credit_methods_iter<K>_group<ID>.png``): every method's credit of the same episodes.
        gamma: the discount used by ``methods``.

    Raises:
        CreditReportError: missing or malformed records, an iteration or group that is not in them (in either run).
    """
    run = load_credit_run(source)
    if iteration is None:
        iteration = run.iterations[-1]
    if group is None:
        if iteration not in run.records:
            run.group_records(iteration, "")  # raises, listing the logged iterations
        group = default_group(run, iteration)
    records = run.group_records(iteration, str(group))
    src = Path(source)
    folder = src.parent if src.is_file() else (src / "credit" if (src / "credit").is_dir() else src)
    out = Path(out_dir) if out_dir is not None else folder / "report"
    out.mkdir(parents=True, exist_ok=True)

    graph = anchor_graph(records)
    graph_png = draw_anchor_graph(graph, out / f"credit_graph_iter{iteration}_group{_safe(group)}.png")
    compare_png = None
    if compare is not None:
        other = load_credit_run(compare)
        other_graph = anchor_graph(other.group_records(iteration, str(group)))
        compare_png = draw_side_by_side(
            [graph, other_graph],
            out / f"credit_compare_iter{iteration}_group{_safe(group)}.png",
            titles=[_graph_title(graph, source), _graph_title(other_graph, compare)],
        )
    stats = run_stats(run)
    dist_png = plot_distributions(stats, out / DISTRIBUTIONS_PNG)
    states = sum(1 for n in graph if not graph.nodes[n]["terminal"])
    shared = sum(1 for n in graph if not graph.nodes[n]["terminal"] and graph.nodes[n]["visits"] > 1)
    graph_line = (
        f"graph: iteration {iteration}, episode group {group}"
        + (f" (task {records[0]['task_id']})" if records[0].get("task_id") else "")
        + f": {graph.graph['trajectories']} trajectories, {graph.graph['won_trajectories']} won; {states} anchor "
        f"states, {shared} visited more than once; {graph.number_of_edges()} (state, action, next state) edges"
    )
    if compare_png is not None:
        graph_line += f"\ncompared with {compare}: {compare_png.name}"
    methods_png = None
    if methods:
        again = [anchor_graph(recredit(records, m, gamma=gamma)) for m in methods]
        methods_png = draw_side_by_side(
            again,
            out / f"credit_methods_iter{iteration}_group{_safe(group)}.png",
            titles=[f"{g.graph['method']} (gamma {gamma:g}, default options)" for g in again],
            columns=2,
        )
        graph_line += f"\nthe same rows credited by {', '.join(methods)}: {methods_png.name}"
    summary = summary_text(run, stats, credit_pairs(run.all_records()), graph_line=graph_line)
    summary_txt = out / SUMMARY_TXT
    summary_txt.write_text(summary + "\n", encoding="utf-8")
    page = out / HTML_PAGE
    method = graph.graph["method"]
    page.write_text(
        _html(summary, graph_png, dist_png, records, iteration, group, method, compare_png, methods_png, folder),
        encoding="utf-8",
    )
    return CreditReport(
        iteration, str(group), graph_png, dist_png, page, summary_txt, summary, compare_png, methods_png
    )


def _graph_title(graph: Any, source: str | Path) -> str:
    g = graph.graph
    return (
        f"{Path(source).name}: {g['method']}, iteration {g['iteration']}, group {g['group']}: {g['trajectories']} "
        f"trajectories, {g['won_trajectories']} won"
    )


def _html(
    summary: str,
    graph_png: Path,
    dist_png: Path,
    records: list[dict[str, Any]],
    iteration: int,
    group: Any,
    method: str,
    compare_png: Path | None,
    methods_png: Path | None,
    folder: Path,
) -> str:
    """One self-contained page: the PNGs inlined as base64, the summary, the group's trajectories (each step's
    observation images beside its action when the records name them, read from ``folder``)."""

    def img(path: Path, style: str = "max-width:100%") -> str:
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        return f'<img alt="{html.escape(path.name)}" src="data:image/png;base64,{data}" style="{style}">'

    def shown(record: dict[str, Any]) -> str:  # the step's images, or a note when a file is missing
        parts = []
        for ref in record.get("images") or []:
            path = folder / ref
            parts.append(img(path, STEP_IMAGE_STYLE) if path.is_file() else f"[missing {html.escape(ref)}]")
        return "".join(parts)

    trajs: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        trajs[r["traj"]].append(r)
    rows = []
    for traj, steps in trajs.items():
        steps.sort(key=lambda r: r["step"])
        moves = " ".join(
            f'{shown(r)}<span style="color:{_sign_colour(r["step_adv"])}">{html.escape(r["action"][:24])} '
            f"({r['step_adv']:+.2f})</span>"
            for r in steps
        )
        rows.append(
            f"<tr><td>{html.escape(str(traj))}</td><td>{len(steps)}</td><td>{steps[0]['episode_return']:.2f}</td>"
            f"<td>{'yes' if steps[0]['won'] else 'no'}</td><td>{steps[0]['episode_adv']:+.2f}</td><td>{moves}</td></tr>"
        )
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{html.escape(method)} credit report</title>
<style>{PAGE_STYLE}</style></head><body>
<h1>What {html.escape(method)} credited</h1>
<pre>{html.escape(summary)}</pre>
<h2>Anchor-state graph: iteration {iteration}, episode group {html.escape(str(group))}</h2>
<p>Nodes are anchor states (the states whose actions the step term compares; size = visits, label = the start of
the observation); the green ring marks the start state, the star the end of won episodes, the grey square the end of
the others. Edges are the actions taken (width = times taken, label = action and count); their colour is the mean
{html.escape(STEP_TERMS.get(method, "step term"))} of that action from that state: blue = credited, red = blamed,
grey = no step signal.</p>
{img(graph_png)}
{"<h2>Beside the other run</h2>" + img(compare_png) if compare_png is not None else ""}
{"<h2>The same rows credited by each method</h2>" + img(methods_png) if methods_png is not None else ""}
<h2>Trajectories of this group (action and its step term, after the observation's image when it had one)</h2>
<table><tr><th>trajectory</th><th>steps</th><th>return</th><th>won</th><th>A_E</th><th>actions (step term)</th></tr>
{"".join(rows)}</table>
<h2>Over the run</h2>
{img(dist_png)}
</body></html>
"""


def _sign_colour(x: float) -> str:
    return sign_colour(x, ZERO)


def _safe(group: Any) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in str(group))[:60]
