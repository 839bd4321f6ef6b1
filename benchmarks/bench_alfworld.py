"""Timing of the ALFWorld adapter and the synthetic game generator (wall clock, medians; CPU only; prints only).

    python benchmarks/bench_alfworld.py                                 # generates 1 game per type into a temp dir
    python benchmarks/bench_alfworld.py --data $ALFWORLD_DATA --games 12 --steps 20

Reports: generation seconds per game; switching an instance to a new game (load + reset) and restarting the
loaded game, each with and without the adapter's engine cache; one step with a random admissible action.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from environments.alfworld.env import AlfWorldEnv
from environments.alfworld.synth import generate

__all__ = ["main", "measure"]


def measure(data_path: str | Path, *, games: int, steps: int, seed: int = 0) -> dict[str, float]:
    """Median seconds of each engine operation, over ``games`` train games (seeds ``0..games-1``).

    ``load+reset`` switches an instance to a new game; ``uncached`` is alfworld's own cost (``engine_cache=False``),
    ``cached, group member`` is a second instance loading the game a first one already loaded (the members of an
    episode group); ``reset same game`` restarts the loaded game; ``step`` is one random admissible action
    (``steps`` per game).
    """
    rng = np.random.default_rng(seed)
    names = ("load+reset uncached", "reset same game uncached", "load+reset cached, group member")
    times: dict[str, list[float]] = {name: [] for name in (*names, "reset same game cached", "step")}
    uncached = AlfWorldEnv(data_path=data_path, max_steps=steps + 1, engine_cache=False)
    first = AlfWorldEnv(data_path=data_path, max_steps=steps + 1)
    member = AlfWorldEnv(data_path=data_path, max_steps=steps + 1)

    def timed(name: str, env: AlfWorldEnv, i: int) -> dict:
        t0 = time.perf_counter()
        _, info = env.reset(seed=i, options={"split": "train"})
        times[name].append(time.perf_counter() - t0)
        return info

    try:
        for i in range(games):
            timed("load+reset uncached", uncached, i)
            timed("reset same game uncached", uncached, i)
            first.reset(seed=i, options={"split": "train"})  # fills the cache
            timed("load+reset cached, group member", member, i)
            info = timed("reset same game cached", member, i)
            for _ in range(steps):
                actions = info["admissible_actions"]
                t0 = time.perf_counter()
                _, _, terminated, truncated, info = member.step(actions[int(rng.integers(len(actions)))])
                times["step"].append(time.perf_counter() - t0)
                if terminated or truncated:
                    break
    finally:
        for env in (uncached, first, member):
            env.close()
    return {name: statistics.median(values) for name, values in times.items() if values}


def main(argv: list[str] | None = None) -> int:
    """CLI (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=None, help="ALFWorld data root (default: generate 1 game per type)")
    parser.add_argument("--games", type=int, default=6, help="train games to play (default 6)")
    parser.add_argument("--steps", type=int, default=15, help="random steps per game (default 15)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data
        if data is None:
            summary = generate(Path(tmp) / "alfworld", games_per_type={"train": 1}, seed=0)
            data = summary.path
            print(f"generation: {summary.n_games} games, median {statistics.median(summary.seconds):.3f} s/game")
        for name, seconds in measure(data, games=args.games, steps=args.steps).items():
            print(f"{name}: {seconds * 1000:.1f} ms (median)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
