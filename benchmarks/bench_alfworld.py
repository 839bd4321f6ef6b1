"""Timing of the ALFWorld adapter and the synthetic game generator (wall clock, medians; CPU only; prints only).

    python benchmarks/bench_alfworld.py                                 # generates 1 game per type into a temp dir
    python benchmarks/bench_alfworld.py --data $ALFWORLD_DATA --games 12 --steps 20
    python benchmarks/bench_alfworld.py --throughput --data DIR --episodes 128 --tasks 16 --processes 1,2,4

Reports: generation seconds per game; switching an instance to a new game (load + reset) and restarting the
loaded game, each with and without the adapter's engine cache; one step with a random admissible action.

``--throughput``: environment steps per second of ``--episodes`` concurrent ALFWorld episodes (``--tasks`` games,
episodes spread evenly over them as episode groups; random admissible actions; up to ``--max-steps`` steps), played
through the episode runner's environment calls (:class:`verl_gigpo.rollout.execution.envcalls.EnvCalls`: pool,
deadlines, threads or worker processes) with no generation in between, in three layouts:

* ``threads``: one process, 64 threads (``env.num_workers=0``): ALFWorld's engine lock serialises the steps;
* ``workers=N``: one process hosting the environments in N worker processes (``env.num_workers=N``);
* ``processes=N``: N independent processes, each playing 1/N of the episodes in threads (what N verl agent-loop
  workers do: ``actor_rollout_ref.rollout.agent.num_workers=N``).

Each layout plays two rounds: ``cold`` (processes start, instances are built, games loaded) and ``warm`` (the same
tasks again on the reused instances). In a round every episode is reset first, then all step together: steps per
second are steps over the stepping phase's wall time; the reset phase is reported apart. CPU ms per step is the CPU
time of every process involved (runner, worker processes, independent processes) over the stepping phase, per step:
the work a step costs, which other load on the machine hardly changes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from environments.alfworld.env import AlfWorldEnv
from environments.alfworld.synth import generate

__all__ = ["main", "measure", "play_round", "throughput"]


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


async def _play(pool, threads, tasks: list[int], max_steps: int, seed: int) -> dict[str, float]:
    """Play one episode per entry of ``tasks`` (train seeds) concurrently through the runner's environment calls:
    every episode is acquired and reset first (``reset_s``), then all step together (``step_s``), so steps per
    second are not mixed with game loads."""
    from verl_gigpo.rollout import Episode, EpisodeConfig, TaskSpec
    from verl_gigpo.rollout.execution import EnvExecution
    from verl_gigpo.rollout.execution.envcalls import EnvCalls

    config = EpisodeConfig(max_steps=max_steps, key_mode="state")
    counts: dict = {"steps": 0, "env_errors": 0, "errors": []}

    async def start(i: int, task_seed: int) -> tuple:
        task = TaskSpec("alfworld", seed=task_seed, split="train")
        episode = Episode(traj_id=str(i), task=task, timing={"env": 0.0})
        calls = EnvCalls(task, config, episode, execution=EnvExecution(), threads=threads, env_pool=pool)
        env = await calls.acquire()
        _, info = await calls.reset(env)
        return calls, env, info

    async def play(i: int, calls, env, info) -> None:
        rng = np.random.default_rng([seed, i])
        broken = False
        try:
            for t in range(max_steps):
                actions = info["admissible_actions"]
                _, _, terminated, truncated, info = await calls.step(env, actions[int(rng.integers(len(actions)))], t)
                counts["steps"] += 1
                if terminated or truncated:
                    break
        except Exception as exc:  # noqa: BLE001 - counted and shown: the benchmark goes on
            counts["env_errors"] += 1
            if len(counts["errors"]) < 3:
                counts["errors"].append(f"{type(exc).__name__}: {exc}"[:400])
            broken = True
        finally:
            await calls.finish(env, broken=broken)

    t0 = time.perf_counter()
    started = await asyncio.gather(*(start(i, s) for i, s in enumerate(tasks)))
    t1, c1 = time.perf_counter(), _cpu_seconds(pool)
    await asyncio.gather(*(play(i, *episode) for i, episode in enumerate(started)))
    t2, c2 = time.perf_counter(), _cpu_seconds(pool)
    return {**counts, "reset_s": t1 - t0, "step_s": t2 - t1, "seconds": t2 - t0, "step_cpu_s": c2 - c1}


def _cpu_seconds(pool) -> float:
    """CPU seconds used so far by this process (all threads) and the pool's worker processes: unlike wall time,
    hardly changed by other load on the machine."""
    total = time.process_time()
    for pid in pool.host.worker_pids() if pool.host is not None else []:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    return total


def play_round(tasks: list[int], *, max_steps: int, workers: int, rounds: int = 2, seed: int = 0) -> list[dict]:
    """Play ``tasks`` (one episode each) ``rounds`` times in this process: ``workers`` worker processes (0 =
    threads); returns each round's steps, env_errors and seconds."""
    from verl_gigpo.rollout import EnvPool
    from verl_gigpo.rollout.execution import EnvExecution
    from verl_gigpo.rollout.execution.threads import EnvThreadPool

    pool, threads = EnvPool(num_workers=workers, execution=EnvExecution()), EnvThreadPool(64)
    try:
        return [asyncio.run(_play(pool, threads, tasks, max_steps, seed + r)) for r in range(rounds)]
    finally:
        pool.close()
        threads.shutdown()


def _episode_tasks(episodes: int, tasks: int) -> list[int]:
    """Train seeds of ``episodes`` episodes over ``tasks`` games in groups of equal size (game k: seed k)."""
    return [k for k in range(tasks) for _ in range(episodes // tasks)] + list(range(episodes % tasks))


def throughput(data: str | Path, *, episodes: int, tasks: int, max_steps: int, processes: list[int]) -> list[dict]:
    """Steps per second of each layout (module docstring), one row per layout and round."""
    seeds = _episode_tasks(episodes, tasks)
    rows = []

    def add(layout: str, results: list[dict]) -> None:
        for name, r in zip(("cold", "warm"), results, strict=False):
            per_step = {"steps_per_s": r["steps"] / r["step_s"], "cpu_ms_per_step": 1000 * r["step_cpu_s"] / r["steps"]}
            rows.append({"layout": layout, "round": name, **r, **per_step})
            print(json.dumps(rows[-1]), flush=True)

    add("threads", play_round(seeds, max_steps=max_steps, workers=0))
    for n in processes:
        add(f"workers={n}", play_round(seeds, max_steps=max_steps, workers=n))
    for n in processes:
        if n == 1:
            continue  # = threads
        shares = [seeds[i::n] for i in range(n)]
        env = {**os.environ, "ALFWORLD_DATA": str(data)}
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--play-share", json.dumps(share), "--max-steps", str(max_steps)],
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            for share in shares
        ]
        outs = [json.loads(proc.communicate()[0].strip().splitlines()[-1]) for proc in procs]
        merged = [
            {  # the layout's phase ends when its slowest process ends it
                "steps": sum(o[r]["steps"] for o in outs),
                "env_errors": sum(o[r]["env_errors"] for o in outs),
                **{k: max(o[r][k] for o in outs) for k in ("reset_s", "step_s", "seconds")},
                "step_cpu_s": sum(o[r]["step_cpu_s"] for o in outs),
            }
            for r in range(2)
        ]
        add(f"processes={n}", merged)
    return rows


def main(argv: list[str] | None = None) -> int:
    """CLI (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=None, help="ALFWorld data root (default: generate 1 game per type)")
    parser.add_argument("--games", type=int, default=6, help="train games to play (default 6)")
    parser.add_argument("--steps", type=int, default=15, help="random steps per game (default 15)")
    parser.add_argument("--throughput", action="store_true", help="steps per second of concurrent episodes")
    parser.add_argument("--episodes", type=int, default=128, help="--throughput: concurrent episodes (default 128)")
    parser.add_argument("--tasks", type=int, default=16, help="--throughput: games (episode groups; default 16)")
    parser.add_argument("--max-steps", type=int, default=10, help="--throughput: steps per episode (default 10)")
    parser.add_argument("--processes", default="1,2,4", help="--throughput: process counts (default 1,2,4)")
    parser.add_argument("--play-share", default=None, help=argparse.SUPPRESS)  # a child of processes=N
    args = parser.parse_args(argv)
    if args.play_share is not None:
        print(json.dumps(play_round(json.loads(args.play_share), max_steps=args.max_steps, workers=0)))
        return 0
    if args.throughput:
        if args.data is None:
            parser.error("--throughput needs --data (generate games with `python -m environments.alfworld.synth`)")
        os.environ["ALFWORLD_DATA"] = str(args.data)
        load = os.getloadavg()[0]
        rows = throughput(
            args.data,
            episodes=args.episodes,
            tasks=args.tasks,
            max_steps=args.max_steps,
            processes=[int(n) for n in args.processes.split(",")],
        )
        print(f"\ncores: {os.cpu_count()}, load average (1 min) before/after: {load:.1f}/{os.getloadavg()[0]:.1f}")
        print(
            "| layout | cold: reset s | cold: steps/s | warm: reset s | warm: steps | warm: steps/s "
            "| warm: CPU ms per step | env errors |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for cold, warm in zip(rows[0::2], rows[1::2], strict=True):
            print(
                f"| {cold['layout']} | {cold['reset_s']:.1f} | {cold['steps_per_s']:.1f} | {warm['reset_s']:.1f} | "
                f"{warm['steps']} | {warm['steps_per_s']:.1f} | {warm['cpu_ms_per_step']:.1f} | "
                f"{cold['env_errors'] + warm['env_errors']} |"
            )
        return 0
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
