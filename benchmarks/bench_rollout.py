"""Rollout glue overhead per step: prompt render + tokenise + decode + parse + bookkeeping (target < 1 ms/step).

    python benchmarks/bench_rollout.py               # writes the table into benchmarks/RESULTS.md
    python benchmarks/bench_rollout.py --no-results

The episode runner (verl_gigpo.rollout.run_episode) is timed with a generator that answers instantly with a
valid action (tokenised once), so what remains besides environment time is the runner's own work: rendering
the prompt with history, applying the chat template and tokenising it (a real Hugging Face tokenizer, trained
locally), decoding the reply and parsing it. ``glue`` is measured inside the runner; ``env`` is time spent in the
environment's reset/step (threads); ``wall`` is total wall time per step for 64 concurrent episodes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import tempfile
import time
from pathlib import Path

from results_md import write_section
from transformers import AutoTokenizer

from environments import make_env
from verl_gigpo.dev.tiny_model import build_tiny_model
from verl_gigpo.rollout import ChatPromptEncoder, EpisodeConfig, GenerationOutput, TaskSpec, run_episode

SECTION = "## Rollout glue overhead"


class InstantGenerator:
    """Answers every request at once with the token ids of one of the environment's example actions."""

    def __init__(self, tokenizer, env_name: str, env_kwargs: dict):
        env = make_env(env_name, **env_kwargs)
        env.reset(seed=0)
        self.ids = tokenizer.encode(f"<action>{env.example_actions()[0]}</action>", add_special_tokens=False)
        env.close()

    async def generate(self, request_id, *, prompt_ids, sampling_params):
        return GenerationOutput(token_ids=list(self.ids), log_probs=[-0.1] * len(self.ids))


async def _run(tokenizer, env_name: str, env_kwargs: dict, episodes: int, max_steps: int):
    config = EpisodeConfig(max_steps=max_steps, history_length=2, max_prompt_length=4096, key_mode="state")
    generator = InstantGenerator(tokenizer, env_name, {**env_kwargs, "max_steps": max_steps})
    encoder = ChatPromptEncoder(tokenizer)
    start = time.perf_counter()
    results = await asyncio.gather(
        *[
            run_episode(
                TaskSpec(env_name, seed=i, env_kwargs=env_kwargs),
                generator=generator,
                encoder=encoder,
                tokenizer=tokenizer,
                config=config,
                traj_id=f"t{i}",
                sampling_params={},
            )
            for i in range(episodes)
        ]
    )
    wall = time.perf_counter() - start
    steps = sum(ep.length for ep in results)
    errors = [ep.env_error for ep in results if ep.env_error]
    if errors:
        raise RuntimeError(f"{env_name}: episodes failed: {errors[:2]}")
    return {
        "steps": steps,
        "glue_ms": 1e3 * sum(ep.timing["glue"] for ep in results) / steps,
        "env_ms": 1e3 * sum(ep.timing["env"] for ep in results) / steps,
        "wall_ms": 1e3 * wall / steps,
        "prompt_tokens": sum(len(s.prompt_ids) for ep in results for s in ep.steps) / steps,
    }


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--no-results", "--no-write", action="store_true", help="print only (--no-write: its old name)")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(Path(tmp) / "model", hidden_size=64, num_layers=1, num_heads=4)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        setups = [("gridnav", {}, 10), ("sokoban", {}, 15), ("webshop", {}, 15), ("search", {}, 4)]
        data = os.environ.get("ALFWORLD_DATA")
        if not data:
            from environments.alfworld.synth import generate

            data = str(Path(tmp) / "alfworld")
            generate(data, games_per_type={"train": 1}, seed=0)
        setups.append(("alfworld", {"data_path": data}, 20))
        for name, kwargs, steps in setups:
            episodes = min(args.episodes, 12) if name == "alfworld" else args.episodes
            result = asyncio.run(_run(tokenizer, name, kwargs, episodes, steps))
            rows.append((name, episodes, result))
            print(name, {k: round(v, 3) for k, v in result.items()})
    table = [
        "| environment | glue per step | env per step | wall per step (concurrent) | prompt tokens (mean) |",
        "|---|---|---|---|---|",
    ]
    for name, episodes, r in rows:
        table.append(
            f"| {name} ({episodes} episodes, {r['steps']} steps) | {r['glue_ms']:.3f} ms | {r['env_ms']:.3f} ms | "
            f"{r['wall_ms']:.3f} ms | {r['prompt_tokens']:.0f} |"
        )
    text = "\n".join(
        [
            SECTION,
            "",
            f"Command: `python benchmarks/bench_rollout.py` — {platform.machine()}, {os.cpu_count()} CPU cores. "
            "Target: glue under 1 ms per step. Generation is instant here, so the figures are the "
            "runner's own cost; the chat template and tokenizer are a real (locally trained) Hugging Face tokenizer. "
            "Tokenising the prompt dominates the glue (about 3 µs per prompt token here, in the event loop), so the "
            "1 ms target holds for short prompts (gridnav) and is missed by 1.5-4x for 400-1,300-token prompts — "
            "still small next to generating a step with a real model. 'env per step' is time inside the environment "
            "(worker threads); ALFWorld's engine dominates its wall time.",
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
