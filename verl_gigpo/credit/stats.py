"""Run-level numbers of the credit report over the WRITTEN rows: anchor-group sizes, singletons, sign disagreement."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from verl_gigpo.credit.load import CreditRun

__all__ = ["ZERO", "PairCredit", "RunStats", "credit_pairs", "run_stats", "summary_text", "top_pairs"]

#: |x| at or below this counts as 0 (an advantage of a flat group is exactly 0; this only absorbs rounding)
ZERO = 1e-9


@dataclass
class RunStats:
    """What the distributions figure and the summary show, over the written rows.

    Per row (rows,): ``episode_adv``, ``step_adv``, ``row_iteration``, ``row_group_size``; ``anchor_group_sizes``
    (anchor_groups,); per iteration dicts: ``singleton_row_frac``, ``disagree_frac`` (opposite signs among rows with
    both terms nonzero; NaN when none), ``both_nonzero_frac``. ``flat_episode_groups``: groups with all-equal returns.
    """

    iterations: list[int]
    rows: int
    episode_groups: int
    anchor_groups: int
    flat_episode_groups: int
    anchor_group_sizes: np.ndarray
    singleton_row_frac: dict[int, float]
    disagree_frac: dict[int, float]
    both_nonzero_frac: dict[int, float]
    episode_adv: np.ndarray
    step_adv: np.ndarray
    row_iteration: np.ndarray
    row_group_size: np.ndarray

    @property
    def singleton_rows_overall(self) -> float:
        """Fraction of all written rows that sit alone in their anchor group."""
        sizes = self.row_group_size
        return float((sizes == 1).mean()) if sizes.size else 0.0

    @property
    def disagree_overall(self) -> float:
        """Over all written rows with both terms nonzero: the fraction where A_E and A_S have opposite signs."""
        both = (np.abs(self.episode_adv) > ZERO) & (np.abs(self.step_adv) > ZERO)
        if not both.any():
            return float("nan")
        return float((np.sign(self.episode_adv[both]) != np.sign(self.step_adv[both])).mean())


def run_stats(run: CreditRun) -> RunStats:
    """The run-level numbers of ``run`` (see :class:`RunStats`)."""
    records = run.all_records()
    a_e = np.array([r["episode_adv"] for r in records], dtype=np.float64)  # (rows,)
    a_s = np.array([r["step_adv"] for r in records], dtype=np.float64)  # (rows,)
    its = np.array([r["iteration"] for r in records], dtype=np.int64)  # (rows,)
    sizes_row = np.array([r["anchor_group_size"] for r in records], dtype=np.int64)  # (rows,)
    anchor = {(r["iteration"], r["anchor_group"]): r["anchor_group_size"] for r in records}
    returns: dict[tuple, set[float]] = defaultdict(set)
    for r in records:
        returns[(r["iteration"], str(r["group"]))].add(r["episode_return"])
    singleton, disagree, both_frac = {}, {}, {}
    for k in run.iterations:
        sel = its == k
        singleton[k] = float((sizes_row[sel] == 1).mean())
        both = sel & (np.abs(a_e) > ZERO) & (np.abs(a_s) > ZERO)
        both_frac[k] = float(both.sum() / sel.sum())
        disagree[k] = float((np.sign(a_e[both]) != np.sign(a_s[both])).mean()) if both.any() else float("nan")
    return RunStats(
        iterations=run.iterations,
        rows=len(records),
        episode_groups=len(returns),
        flat_episode_groups=sum(len(v) == 1 for v in returns.values()),
        anchor_groups=len(anchor),
        anchor_group_sizes=np.array(list(anchor.values()), dtype=np.int64),
        singleton_row_frac=singleton,
        disagree_frac=disagree,
        both_nonzero_frac=both_frac,
        episode_adv=a_e,
        step_adv=a_s,
        row_iteration=its,
        row_group_size=sizes_row,
    )


@dataclass(frozen=True)
class PairCredit:
    """One (anchor state, action) pair: the rows that took ``action`` from anchor group ``anchor_group``.

    step_adv_mean: their mean A_S; count: how many rows; observation: the state's observation (as recorded).
    """

    iteration: int
    group: str
    anchor_group: int
    observation: str
    action: str
    count: int
    step_adv_mean: float


def credit_pairs(records: Sequence[dict[str, Any]]) -> list[PairCredit]:
    """Every (anchor state, action) pair of ``records`` whose anchor group has more than one row (a singleton's
    A_S is 0 by construction), with the mean A_S of its rows."""
    rows: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        if r["anchor_group_size"] > 1:
            action = r["action"] if r["action_valid"] else "(invalid)"
            rows[(r["iteration"], str(r["group"]), r["anchor_group"], action)].append(r)
    return [
        PairCredit(
            iteration=k[0],
            group=k[1],
            anchor_group=k[2],
            observation=v[0]["observation"],
            action=k[3],
            count=len(v),
            step_adv_mean=float(np.mean([r["step_adv"] for r in v])),
        )
        for k, v in rows.items()
    ]


def top_pairs(pairs: Sequence[PairCredit], k: int = 5, *, credited: bool = True) -> list[PairCredit]:
    """The ``k`` pairs with the highest (``credited``) or lowest mean A_S, strictly positive resp. negative; ties
    go to the pair taken more often."""
    sign = 1.0 if credited else -1.0
    chosen = [p for p in pairs if sign * p.step_adv_mean > ZERO]
    return sorted(chosen, key=lambda p: (-sign * p.step_adv_mean, -p.count, p.iteration, p.anchor_group))[:k]


def summary_text(run: CreditRun, stats: RunStats, pairs: Sequence[PairCredit], *, graph_line: str = "") -> str:
    """The terminal summary: what was read, groups and singletons, sign disagreement, top-credited and top-blamed
    (state, action) pairs with their mean A_S."""
    its = stats.iterations
    shown = ", ".join(str(k) for k in its[:12]) + (" ..." if len(its) > 12 else "")
    sizes = stats.anchor_group_sizes
    lines = [
        f"credit records: {run.source}",
        f"  {len(its)} logged iteration(s) ({shown}); {stats.rows} step rows of {stats.episode_groups} episode "
        f"group(s)",
        f"  anchor groups: {stats.anchor_groups}, size mean {sizes.mean():.1f} / max {sizes.max()}; singletons: "
        f"{(sizes == 1).mean():.0%} of the anchor groups, {stats.singleton_rows_overall:.0%} of the rows (A_S = 0)",
    ]
    lines.append(
        f"  episode groups whose trajectories all have the same return (A_E = 0, only the step term teaches): "
        f"{stats.flat_episode_groups} of {stats.episode_groups}"
    )
    if len(its) > 1:
        first, last = its[0], its[-1]
        lines.append(
            f"  rows in singleton anchor groups: {stats.singleton_row_frac[first]:.0%} (iteration {first}) -> "
            f"{stats.singleton_row_frac[last]:.0%} (iteration {last})"
        )
    dis = stats.disagree_overall
    if np.isnan(dis):
        lines.append("  A_E and A_S: no row has both terms nonzero")
    else:
        both = (np.abs(stats.episode_adv) > ZERO) & (np.abs(stats.step_adv) > ZERO)
        lines.append(
            f"  A_E and A_S disagree in sign on {dis:.0%} of the {int(both.sum())} rows where both are nonzero "
            f"({both.mean():.0%} of the rows)"
        )
    if graph_line:
        lines.append(graph_line)
    for credited in (True, False):
        top = top_pairs(pairs, 5, credited=credited)
        word = "credited" if credited else "blamed"
        lines.append(f"top-{word} (state, action) pairs, by mean A_S over the rows that took the action there:")
        if not top:
            lines.append(f"  (none: no {word} action from a shared state)")
        for p in top:
            obs = " ".join(p.observation.split())
            obs = obs if len(obs) <= 60 else obs[:59] + "…"
            lines.append(
                f"  {p.step_adv_mean:+.2f}  n={p.count:<3d} iter {p.iteration} group {p.group}: {obs!r} -> {p.action!r}"
            )
    return "\n".join(lines)
