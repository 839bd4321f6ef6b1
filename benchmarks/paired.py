"""Paired comparisons for the learning reports: each configuration's difference from a baseline seed by seed (same
seed, same validation tasks), with a 95 % interval from the paired t (``docs/benchmarks.md``, "Paired comparisons").
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np


def t_two_sided_mass(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with ``df`` (integer >= 1) degrees of freedom, exactly (Abramowitz & Stegun
    26.7.3-4): with theta = atan(t / sqrt(df)), c = cos theta, s = sin theta,
    odd df: (2/pi) (theta + s (c + 2/3 c^3 + ... + [2*4*...*(df-3)] / [1*3*...*(df-2)] c^(df-2))),
    even df: s (1 + 1/2 c^2 + ... + [1*3*...*(df-3)] / [2*4*...*(df-2)] c^(df-2))."""
    if df < 1 or int(df) != df:
        raise ValueError(f"df must be an integer >= 1, got {df}")
    theta = math.atan(abs(t) / math.sqrt(df))
    s, c = math.sin(theta), math.cos(theta)
    if df % 2:
        term, total = c, c if df > 1 else 0.0
        for k in range(3, df - 1, 2):  # terms c^3 .. c^(df-2)
            term *= c * c * (k - 1) / k
            total += term
        return 2 / math.pi * (theta + s * total)
    term, total = 1.0, 1.0
    for k in range(2, df - 1, 2):  # terms c^2 .. c^(df-2)
        term *= c * c * (k - 1) / k
        total += term
    return s * total


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile (0.5 < p < 1) of Student's t with ``df`` degrees of freedom: the t with
    P(|T| <= t) = 2p - 1, found by bisection on :func:`t_two_sided_mass` (to 1e-12). t_quantile(0.975, 4) = 2.776."""
    if not 0.5 < p < 1:
        raise ValueError(f"p must lie in (0.5, 1), got {p}")
    target, lo, hi = 2 * p - 1, 0.0, 1.0
    while t_two_sided_mass(hi, df) < target:
        hi *= 2
    while hi - lo > 1e-12 * max(1.0, hi):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_two_sided_mass(mid, df) < target else (lo, mid)
    return (lo + hi) / 2


def paired_difference(values: Mapping[int, float], baseline: Mapping[int, float]) -> dict[str, float]:
    """Mean of d_s = values[s] - baseline[s] over the seeds both hold, and its 95 % interval
    mean ± t_{0.975, n-1} * sd(d) / sqrt(n) (sd with ddof 1). Returns ``n``, ``mean``, ``low``, ``high``
    (nan bounds when n < 2; nan mean when n = 0)."""
    seeds = sorted(set(values) & set(baseline))
    d = np.array([values[s] - baseline[s] for s in seeds], dtype=float)  # (n,)
    n = len(d)
    mean = float(d.mean()) if n else float("nan")
    if n < 2:
        return {"n": n, "mean": mean, "low": float("nan"), "high": float("nan")}
    half = t_quantile(0.975, n - 1) * float(d.std(ddof=1)) / math.sqrt(n)
    return {"n": n, "mean": mean, "low": mean - half, "high": mean + half}


def format_difference(diff: Mapping[str, float]) -> str:
    """``+0.12 [-0.03, +0.27]``; ``+0.12 (1 seed)`` without an interval; ``-`` without seeds."""
    if diff["n"] == 0:
        return "-"
    if diff["n"] < 2:
        return f"{diff['mean']:+.2f} (1 seed)"
    return f"{diff['mean']:+.2f} [{diff['low']:+.2f}, {diff['high']:+.2f}]"


def paired_table(
    per_seed: Mapping[str, Mapping[str, Mapping[int, float]]], baseline: Mapping[str, str], metrics: Mapping[str, str]
) -> list[str]:
    """Markdown: per configuration (``per_seed[config][metric][seed]``) its paired difference from
    ``baseline[config]`` for every metric (``metrics``: key -> column title); configurations without a baseline run,
    and the baselines themselves, are left out. [] when no row remains."""
    lines = []
    for name, values in per_seed.items():
        base = baseline.get(name)
        if base is None or base == name or base not in per_seed:
            continue
        diffs = [paired_difference(values[m], per_seed[base][m]) for m in metrics]
        cells = " | ".join(format_difference(d) for d in diffs)
        lines.append(f"| {name} | {base} | {diffs[0]['n']} | {cells} |")
    if not lines:
        return []
    head = " | ".join(f"{title} − baseline (95 % CI)" for title in metrics.values())
    return [f"| config | baseline | paired seeds | {head} |", "|---|---|---|" + "---|" * len(metrics), *lines]
