"""Environment speed: median ``reset`` and ``step`` wall time of every registered environment (CPU).

    python benchmarks/bench_envs.py                  # writes the table into benchmarks/RESULTS.md
    python benchmarks/bench_envs.py --no-results --episodes 20

Each environment plays ``--episodes`` tasks (seeds 0..E-1) with uniformly random example actions (the admissible
actions, or representative ones for free-text environments) for up to ``--steps`` steps. ALFWorld plays synthetic
games generated into a temporary folder (one per task type) unless ``ALFWORLD_DATA`` is set. ``webshop_real`` is
skipped when WebShop is not installed.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from results_md import write_section

from environments import list_envs, make_env

SECTION = "## Environment speed"


def measure(name: str, kwargs: dict, episodes: int, steps: int) -> dict[str, float]:
    """Median reset and step seconds of environment ``name`` over ``episodes`` random-action episodes."""
    env = make_env(name, **kwargs)
    rng = np.random.default_rng(0)
    resets, step_times = [], []
    try:
        for seed in range(episodes):
            start = time.perf_counter()
            env.reset(seed=seed)
            resets.append(time.perf_counter() - start)
            for _ in range(steps):
                actions = env.example_actions()
                action = actions[int(rng.integers(len(actions)))] if actions else None
                start = time.perf_counter()
                _, _, terminated, truncated, _ = env.step(action)
                step_times.append(time.perf_counter() - start)
                if terminated or truncated:
                    break
    finally:
        env.close()
    return {"reset": statistics.median(resets), "step": statistics.median(step_times), "steps": len(step_times)}


def _fmt(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.0f} µs"


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=30)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--no-results", "--no-write", action="store_true", help="print only (--no-write: its old name)")
    args = parser.parse_args(argv)

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in list_envs():
            kwargs: dict = {"max_steps": args.steps}
            episodes = args.episodes
            if name == "alfworld":
                if not os.environ.get("ALFWORLD_DATA"):
                    from environments.alfworld.synth import generate

                    generate(Path(tmp) / "alfworld", games_per_type={"train": 1}, seed=0)
                    kwargs["data_path"] = str(Path(tmp) / "alfworld")
                episodes = min(episodes, 12)
            try:
                result = measure(name, kwargs, episodes, args.steps)
            except ImportError as exc:
                print(f"skip {name}: {str(exc).splitlines()[0]}")
                continue
            rows.append((name, result, episodes))
            print(f"{name:14s} reset {_fmt(result['reset']):>10s}  step {_fmt(result['step']):>10s}")

    table = [
        "| environment | reset (median) | step (median) | episodes x steps measured |",
        "|---|---|---|---|",
    ]
    table += [
        f"| {n} | {_fmt(r['reset'])} | {_fmt(r['step'])} | {e} episodes, {r['steps']} steps |" for n, r, e in rows
    ]
    text = "\n".join(
        [
            SECTION,
            "",
            f"Command: `python benchmarks/bench_envs.py` — {platform.machine()}, {os.cpu_count()} CPU cores, "
            f"Python {platform.python_version()}. Random example actions; ALFWorld on synthetic games (one per task "
            "type, real TextWorld engine).",
            "",
            *table,
            "",
        ]
    )
    print(text)
    if not args.no_results:
        write_section(text, SECTION)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
