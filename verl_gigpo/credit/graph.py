"""The anchor-state graph of one episode group: which actions the step-credit estimator credited from which state.

Nodes are anchor groups plus the terminal nodes :data:`WON` and :data:`NOT_WON`; edges are actions, coloured by their
mean step term. How it is built and read: docs/credit-report.md.
"""

from __future__ import annotations

import textwrap
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np
from matplotlib import colormaps
from matplotlib.colors import Normalize, to_hex
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

__all__ = [
    "CMAP",
    "INVALID",
    "NOT_WON",
    "STEP_TERMS",
    "WON",
    "anchor_graph",
    "anchor_graph_figure",
    "credit_colour",
    "draw_anchor_graph",
    "draw_side_by_side",
    "loop_labels",
]

#: terminal node ids
WON = "won"
NOT_WON = "not won"
#: the edge key of every action that was not a valid action (their texts differ; one edge per state)
INVALID = "(invalid)"
#: diverging colour map of the edges: low (blamed, A_S < 0) red, 0 light grey, high (credited) blue
CMAP = "coolwarm_r"
#: method -> what its step term (the records' ``step_adv``, the edge colour) is
STEP_TERMS = {
    "gigpo": "GiGPO step advantage A_S",
    "hgpo": "HGPO step term (mix over history depths)",
    "graphgpo": "GraphGPO graph advantage A_G",
    "g2po": "G2PO step term A_1 + A_2",
}
#: method -> (record field, label) of the value shown on each state node
_NODE_VALUES = {"graphgpo": ("distance", "d"), "g2po": ("node_value", "V")}


def credit_colour(value: float, vmax: float) -> str:
    """The hex colour of a mean step advantage ``value`` on :data:`CMAP` over ``[-vmax, vmax]`` (clipped)."""
    norm = Normalize(vmin=-vmax, vmax=vmax, clip=True)
    return to_hex(colormaps[CMAP](norm(value)))


def anchor_graph(records: Sequence[dict[str, Any]], *, label_chars: int = 40) -> nx.MultiDiGraph:
    """The ``MultiDiGraph`` of the records of one episode group of one iteration (edge key: the action).

    Node labels are the first ``label_chars`` characters of the observation; attributes: docs/credit-report.md.
    """
    if not records:
        raise ValueError("anchor_graph needs the credit records of one episode group; got none")
    keys = {(r["iteration"], str(r["group"])) for r in records}
    if len(keys) != 1:
        raise ValueError(
            f"anchor_graph draws ONE episode group of ONE iteration; the records hold {len(keys)} "
            f"(iteration, group) pairs: {sorted(keys)[:5]}"
        )
    ((iteration, group),) = keys
    methods = {r.get("method", "gigpo") for r in records}  # records written before methods existed are GiGPO's
    if len(methods) != 1:
        raise ValueError(f"anchor_graph draws the credit of one method; the records hold {sorted(methods)}")
    (method,) = methods
    value_field, value_name = _NODE_VALUES.get(method, (None, ""))
    trajs: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        trajs[r["traj"]].append(r)

    graph = nx.MultiDiGraph(iteration=iteration, group=group, method=method)
    node_adv: dict[Any, list[float]] = defaultdict(list)
    edge_adv: dict[tuple[Any, Any, str], list[float]] = defaultdict(list)
    starts, ends = set(), {WON: 0, NOT_WON: 0}
    for rows in trajs.values():
        rows = sorted(rows, key=lambda r: r["step"])
        starts.add(rows[0]["anchor_group"])
        end = WON if rows[0]["won"] else NOT_WON
        ends[end] += 1
        for i, r in enumerate(rows):
            u = r["anchor_group"]
            if u not in graph:
                label = textwrap.fill(_excerpt(r["observation"], label_chars), width=max(12, label_chars // 2))
                value = {}
                if value_field is not None and value_field in r:  # a property of the state: the same on its rows
                    value = {"value": float(r[value_field])}
                    label += f"\n{value_name}={r[value_field]:.3g}"
                graph.add_node(
                    u,
                    observation=r["observation"],
                    label=label,
                    anchor_key=r["anchor_key"],
                    depth=r["step"],
                    terminal=False,
                    won=False,
                    **value,
                )
            graph.nodes[u]["depth"] = min(graph.nodes[u]["depth"], r["step"])
            node_adv[u].append(float(r["step_adv"]))
            v = rows[i + 1]["anchor_group"] if i + 1 < len(rows) else end
            action = r["action"] if r["action_valid"] else INVALID
            edge_adv[(u, v, action)].append(float(r["step_adv"]))

    depth = max((d for _, d in graph.nodes(data="depth")), default=-1) + 1
    for end, count in ends.items():
        if count:
            graph.add_node(end, observation="", label=end, anchor_key="", depth=depth, terminal=True, won=end == WON)
            graph.nodes[end]["visits"] = count
            graph.nodes[end]["step_adv_mean"] = 0.0
    for u, values in node_adv.items():
        graph.nodes[u]["visits"] = len(values)
        graph.nodes[u]["step_adv_mean"] = float(np.mean(values))
    for node in graph:
        graph.nodes[node]["start"] = node in starts

    means = {e: float(np.mean(v)) for e, v in edge_adv.items()}
    vmax = max((abs(m) for m in means.values()), default=0.0) or 1.0
    most = max(len(v) for v in edge_adv.values())
    for (u, v, action), values in edge_adv.items():
        graph.add_edge(
            u,
            v,
            key=action,
            count=len(values),
            step_adv_mean=means[(u, v, action)],
            color=credit_colour(means[(u, v, action)], vmax),
            width=1.0 + 5.0 * len(values) / most,
        )
    graph.graph.update(vmax=vmax, trajectories=len(trajs), won_trajectories=ends[WON])
    return graph


def draw_anchor_graph(graph: nx.MultiDiGraph, path: str | Path, *, title: str | None = None) -> Path:
    """Draw :func:`anchor_graph`'s graph to a PNG at ``path`` (encoding: docs/credit-report.md)."""
    fig = anchor_graph_figure(graph, title=title)
    path = Path(path)
    fig.savefig(path)
    return path


def anchor_graph_figure(graph: nx.MultiDiGraph, *, title: str | None = None) -> Figure:
    """The figure :func:`draw_anchor_graph` writes."""
    width, height = _figure_size(graph)
    fig = Figure(figsize=(width, height), dpi=100)
    _draw(fig, fig.add_subplot(), graph, title, graph.graph["vmax"])
    fig.tight_layout()
    return fig


def draw_side_by_side(
    graphs: Sequence[nx.MultiDiGraph], path: str | Path, *, titles: Sequence[str], columns: int | None = None
) -> Path:
    """Draw several :func:`anchor_graph` graphs side by side to a PNG at ``path`` on ONE colour scale."""
    vmax = max(g.graph["vmax"] for g in graphs)
    columns = columns or len(graphs)
    rows = -(-len(graphs) // columns)
    sizes = [_figure_size(g) for g in graphs]
    width = min(columns * max(w for w, _ in sizes), 30.0)
    fig = Figure(figsize=(width, rows * max(h for _, h in sizes)), dpi=100)
    for k, (graph, title) in enumerate(zip(graphs, titles, strict=True)):
        _draw(fig, fig.add_subplot(rows, columns, k + 1), graph, title, vmax)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    return path


def _figure_size(graph: nx.MultiDiGraph) -> tuple[float, float]:
    columns = len({d for _, d in graph.nodes(data="depth")})
    tallest = max(Counter(d for _, d in graph.nodes(data="depth")).values())  # states in the fullest column
    return min(3.0 + 1.9 * columns, 22.0), min(3.6 + 1.1 * tallest, 9.0)


def _draw(fig: Figure, ax: Any, graph: nx.MultiDiGraph, title: str | None, vmax: float) -> None:
    """Draw ``graph`` on ``ax`` (edge colours on the scale ``[-vmax, vmax]``)."""
    pos = nx.multipartite_layout(graph, subset_key="depth", align="vertical", scale=1.0)
    ys = [y for _, y in pos.values()]
    if max(ys) - min(ys) < 0.3:
        # one state per column (a single path): networkx sizes self-loops by the drawing's height, which is then
        # ~0, and falls back to huge loops; alternate the columns up and down a little instead
        pos = {n: (x, y + (0.3 if graph.nodes[n]["depth"] % 2 else -0.3)) for n, (x, y) in pos.items()}
    most = max(graph.nodes[n]["visits"] for n in graph)
    size = {n: 250.0 + 1600.0 * graph.nodes[n]["visits"] / most for n in graph}

    states = [n for n in graph if not graph.nodes[n]["terminal"]]
    starts = [n for n in states if graph.nodes[n]["start"]]
    for subset, edge, width in ((states, "#555555", 1.0), (starts, "#2ca02c", 3.5)):  # start states: a green ring
        if subset:
            nx.draw_networkx_nodes(
                graph,
                pos,
                nodelist=subset,
                node_size=[size[n] for n in subset],
                node_color="#f3f3f3",
                edgecolors=edge,
                linewidths=width,
                ax=ax,
            )
    for end, shape, colour in ((WON, "*", "#f2c12e"), (NOT_WON, "s", "#b0b0b0")):
        if end in graph:
            nx.draw_networkx_nodes(
                graph,
                pos,
                nodelist=[end],
                node_size=[size[end] * 1.6],
                node_shape=shape,
                node_color=colour,
                edgecolors="#555555",
                ax=ax,
            )

    # one call for all edges: networkx numbers parallel edges between two nodes and gives the k-th the k-th style
    # (increasing curvature, so each stays visible; u->v and v->u bend to opposite sides), and sizes self-loops
    # (a move that kept the state) by the extent of the whole drawing
    edges = list(graph.edges(keys=True, data=True))
    parallel = max((graph.number_of_edges(u, v) for u, v, _, _ in edges), default=1)
    styles = [f"arc3,rad={0.1 + 0.15 * k:.2f}" for k in range(parallel)]
    nodes = list(graph)
    nx.draw_networkx_edges(
        graph,
        pos,
        edgelist=[(u, v, k) for u, v, k, _ in edges],
        width=[d["width"] for *_, d in edges],
        edge_color=[credit_colour(d["step_adv_mean"], vmax) for *_, d in edges],
        connectionstyle=styles,
        arrowsize=14,
        nodelist=nodes,
        node_size=[size[n] for n in nodes],
        ax=ax,
    )
    moves = {(u, v, k): f"{_excerpt(str(k), 14)} ({d['count']})" for u, v, k, d in edges if u != v}
    nx.draw_networkx_edge_labels(
        graph,
        pos,
        edge_labels=moves,
        connectionstyle=styles,
        font_size=7,
        bbox={"alpha": 0.0},
        nodelist=nodes,
        node_size=[size[n] for n in nodes],
        ax=ax,
    )
    labels = {n: graph.nodes[n]["label"] for n in graph}
    nx.draw_networkx_labels(graph, pos, labels=labels, font_size=7, ax=ax)
    for node, text in loop_labels(graph).items():  # one line under the node: loop labels overlapped its label
        below = -(size[node] ** 0.5) / 2 - 2  # the node's radius in points (node_size is its area), and a gap
        ax.annotate(text, pos[node], xytext=(0, below), textcoords="offset points", ha="center", va="top", fontsize=7)

    mappable = _scalar_mappable(vmax)
    term = STEP_TERMS.get(graph.graph.get("method", "gigpo"), "step term")
    fig.colorbar(mappable, ax=ax, fraction=0.03, pad=0.01, label=f"mean {term} of the action")
    handles = [
        Line2D([], [], marker="o", ls="", mfc="#f3f3f3", mec="#2ca02c", mew=3, ms=12, label="start state"),
        Line2D([], [], marker="*", ls="", mfc="#f2c12e", mec="#555555", ms=16, label="won (episode ended)"),
        Line2D([], [], marker="s", ls="", mfc="#b0b0b0", mec="#555555", ms=11, label="not won (lost / step limit)"),
    ]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=3, fontsize=8, frameon=False)
    g = graph.graph
    ax.set_title(
        title
        or f"{g.get('method', 'gigpo')}: iteration {g['iteration']}, episode group {g['group']}: {g['trajectories']} "
        f"trajectories, {g['won_trajectories']} won; node size = visits, edge width = times taken",
        fontsize=10,
    )
    ax.margins(0.08)
    ax.set_axis_off()


def loop_labels(graph: nx.MultiDiGraph) -> dict[Any, str]:
    """Per state with self-loops (actions that kept the state), one label: ``stay: up (3), left (1)``."""
    loops: dict[Any, list[str]] = defaultdict(list)
    for u, v, k, d in graph.edges(keys=True, data=True):
        if u == v:
            loops[u].append(f"{_excerpt(str(k), 14)} ({d['count']})")
    return {node: "stay: " + ", ".join(actions) for node, actions in loops.items()}


def _scalar_mappable(vmax: float):
    from matplotlib.cm import ScalarMappable

    return ScalarMappable(norm=Normalize(vmin=-vmax, vmax=vmax), cmap=colormaps[CMAP])


def _excerpt(text: str, chars: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= chars else text[: chars - 1] + "…"
