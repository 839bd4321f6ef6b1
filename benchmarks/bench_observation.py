"""One huge observation must not stall the other episodes: normal episodes' generate seconds with and without it.

    python benchmarks/bench_observation.py               # writes its section into benchmarks/RESULTS.md
    python benchmarks/bench_observation.py --no-results --repeats 1

Sixteen gridnav episodes play ten steps each through the real episode runner (verl_gigpo.rollout.run_episode), the
real chat template and a real Hugging Face tokenizer (trained locally), against a generator that answers every
request after ``--latency-ms`` of asynchronous waiting, as a remote rollout server does (verl's agent loop awaits
vLLM/SGLang servers in the same way). A seventeenth episode, when present, gets one observation of ``--obs-mb``
megabytes at its first step (a tool that dumps a log, a page that never ends).

Measured: the mean seconds the sixteen normal episodes spent awaiting the generator (``Episode.timing["generate"]``).
Whatever holds the event loop (tokenising a huge prompt in it) delays every other episode's awaits, so their
generate seconds grow. Target: within 20 % of the run without the huge episode. The runs alternate (without, with)
``--repeats`` times; medians are reported.

The same script runs on an older checkout of the package (``PYTHONPATH=old_checkout python
benchmarks/bench_observation.py --no-results``) to show the figures before the observation cap.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from results_md import write_section
from transformers import AutoTokenizer

from environments.gridnav.env import GridNavEnv
from verl_gigpo.dev.tiny_model import build_tiny_model
from verl_gigpo.rollout import ChatPromptEncoder, EpisodeConfig, GenerationOutput, TaskSpec, run_episode

SECTION = "## A huge observation among normal episodes"
REPLY = "<think>Keep going.</think><action>wait</action>"  # not a move: every episode plays all its steps


class LatencyGenerator:
    """Answers every request with ``REPLY`` after ``latency`` seconds of asynchronous waiting (a remote server)."""

    def __init__(self, tokenizer, latency: float):
        self.ids = tokenizer.encode(REPLY, add_special_tokens=False)
        self.latency = latency

    async def generate(self, request_id, *, prompt_ids, sampling_params):
        await asyncio.sleep(self.latency)
        return GenerationOutput(token_ids=list(self.ids), log_probs=[-0.1] * len(self.ids))


class HugeObservationGridNav(GridNavEnv):
    """Gridnav whose first step answers with ``observation_chars`` characters of log text before the real
    observation."""

    observation_chars = 2_000_000

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        if info["step"] == 1:
            line = "tool output: 0123456789 abcdefghij ABCDEFGHIJ\n"
            obs = (line * (self.observation_chars // len(line) + 1))[: self.observation_chars] + obs
        return obs, reward, terminated, truncated, info


async def _run(tokenizer, config: EpisodeConfig, latency: float, episodes: int, huge_chars: int) -> dict[str, float]:
    generator = LatencyGenerator(tokenizer, latency)
    encoder = ChatPromptEncoder(tokenizer)

    def huge_factory(task, cfg):
        env = HugeObservationGridNav(max_steps=cfg.max_steps, key_mode=cfg.key_mode)
        env.observation_chars = huge_chars
        return env

    runs = [
        run_episode(
            TaskSpec("gridnav", seed=i),
            generator=generator,
            encoder=encoder,
            tokenizer=tokenizer,
            config=config,
            traj_id=f"normal{i}",
            sampling_params={},
        )
        for i in range(episodes)
    ]
    if huge_chars:
        runs.append(
            run_episode(
                TaskSpec("gridnav", seed=episodes),
                generator=generator,
                encoder=encoder,
                tokenizer=tokenizer,
                config=config,
                traj_id="huge",
                sampling_params={},
                env_factory=huge_factory,
            )
        )
    start = time.perf_counter()
    results = await asyncio.gather(*runs)
    wall = time.perf_counter() - start
    errors = [ep.env_error for ep in results if ep.env_error]
    if errors:
        raise RuntimeError(f"episodes failed: {errors[:2]}")
    normal = results[:episodes]
    out = {
        "normal_generate_s": statistics.mean(ep.timing["generate"] for ep in normal),
        "wall_s": wall,
        "ideal_generate_s": latency * statistics.mean(ep.length for ep in normal),
    }
    if huge_chars:
        huge = results[-1]
        out["huge_glue_s"] = huge.timing["glue"]
        out["huge_prompt_tokens_max"] = max(len(s.prompt_ids) for s in huge.steps)
        out["huge_observation_cut_steps"] = sum(getattr(s, "observation_truncated", False) for s in huge.steps)
    return out


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=16, help="normal episodes (default 16)")
    parser.add_argument("--steps", type=int, default=10, help="steps per episode (default 10)")
    parser.add_argument("--latency-ms", type=float, default=50.0, help="generator latency per request (default 50)")
    parser.add_argument("--obs-mb", type=float, default=2.0, help="size of the huge observation in MB (default 2)")
    parser.add_argument("--prompt-length", type=int, default=2048, help="data.max_prompt_length (default 2048)")
    parser.add_argument("--repeats", type=int, default=3, help="(without, with) pairs; medians reported")
    parser.add_argument("--no-results", "--no-write", action="store_true", help="print only (--no-write: its old name)")
    args = parser.parse_args(argv)
    config = EpisodeConfig(
        max_steps=args.steps, history_length=2, max_prompt_length=args.prompt_length, max_response_length=64
    )
    huge_chars = int(args.obs_mb * 1_000_000)
    latency = args.latency_ms / 1000
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(Path(tmp) / "model", hidden_size=64, num_layers=1, num_heads=4)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        without, with_huge = [], []
        for _ in range(args.repeats):
            without.append(asyncio.run(_run(tokenizer, config, latency, args.episodes, 0)))
            with_huge.append(asyncio.run(_run(tokenizer, config, latency, args.episodes, huge_chars)))
            print("without", {k: round(v, 3) for k, v in without[-1].items()})
            print("with   ", {k: round(v, 3) for k, v in with_huge[-1].items()})

    def median(runs: list[dict[str, float]], key: str) -> float:
        return statistics.median(r[key] for r in runs)

    base, huge = median(without, "normal_generate_s"), median(with_huge, "normal_generate_s")
    ratio = huge / base
    cap = getattr(config, "max_observation_chars", 0)  # 0: a checkout from before the observation cap
    table = [
        "| run | normal episodes' generate s (mean, median of runs) | ideal (latency x steps) | wall s |",
        "|---|---|---|---|",
        f"| {args.episodes} normal episodes | {base:.3f} | {median(without, 'ideal_generate_s'):.3f} | "
        f"{median(without, 'wall_s'):.2f} |",
        f"| the same + one {args.obs_mb:g} MB observation | {huge:.3f} ({100 * (ratio - 1):+.0f} %) | "
        f"{median(with_huge, 'ideal_generate_s'):.3f} | {median(with_huge, 'wall_s'):.2f} |",
    ]
    text = "\n".join(
        [
            SECTION,
            "",
            f"Command: `python benchmarks/bench_observation.py` — {platform.machine()}, {os.cpu_count()} CPU cores, "
            f"{args.episodes} gridnav episodes of {args.steps} steps, generator latency {args.latency_ms:g} ms, "
            f"`data.max_prompt_length={args.prompt_length}`, history 2, {args.repeats} runs each. Target: the normal "
            "episodes' generate seconds within 20 % of the run without the huge observation. The huge episode's "
            f"observation is cut to {cap:,} characters (8 per prompt token) and its prompts are tokenised once, in a "
            f"worker thread; its glue took {median(with_huge, 'huge_glue_s'):.2f} s in all.",
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
