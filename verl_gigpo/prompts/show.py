"""The exact prompt of a sample state, built by the episode runner's own :func:`~verl_gigpo.rollout.build_prompt`,
with its token count under a model's chat template."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from environments import TextEnv
from environments.images import IMAGE_INFO_KEY
from verl_gigpo.rollout.episode import ChatPromptEncoder, build_prompt
from verl_gigpo.rollout.factory import make_task_env
from verl_gigpo.rollout.types import OVERLONG_RULES, EpisodeConfig, PromptOptions, TaskSpec

__all__ = ["RECIPE_PROMPT_LENGTH", "SamplePrompt", "default_model", "overlong_note", "sample_prompt"]

#: data.max_prompt_length of each paper recipe (recipes/run_<env>.sh PROMPT_LENGTH) and of the local engine (gridnav)
RECIPE_PROMPT_LENGTH = {"alfworld": 2048, "webshop": 4096, "sokoban": 1024, "search": 4096, "gridnav": 512}

#: the tiny model ``make demo`` builds, the default tokenizer when present
TINY_MODEL = Path(__file__).resolve().parents[2] / "artifacts" / "tiny-model"


@dataclass
class SamplePrompt:
    """What :func:`sample_prompt` built: the prompt text, its token ids (None without a tokenizer; the images' tokens
    not counted), the steps taken before it, the history items it shows and the current observation's images."""

    text: str
    ids: list[int] | None
    taken: int
    history_used: int
    images: int = 0


def default_model() -> str | None:
    """The tiny model's folder when it exists (``make demo`` builds it), else None."""
    return str(TINY_MODEL) if (TINY_MODEL / "config.json").exists() else None


def _next_action(env: TextEnv, info: Mapping[str, Any]) -> str:
    """A deterministic action for the sample: the environment's first example action, else its first admissible."""
    examples = getattr(env, "example_actions", None)
    if callable(examples) and examples():
        return examples()[0]
    actions = info.get("admissible_actions") or []
    if not actions:
        raise ValueError(f"{env.name}: no admissible or example action to play the sample episode with")
    return actions[0]


def sample_prompt(
    env_name: str,
    step: int,
    prompt: Mapping[str, Any],
    *,
    seed: int = 0,
    history_length: int = 2,
    env_kwargs: Mapping[str, Any] | None = None,
    tokenizer: Any = None,
) -> SamplePrompt:
    """The prompt of step ``step`` (1 = the first; ``step - 1`` steps taken before it, each the environment's first
    example or admissible action) of task ``seed``, under the ``env.prompt`` section ``prompt``, as
    :func:`build_prompt` renders it for the engines (no token budget applied).

    Raises:
        ValueError: ``step`` < 1, a bad ``env.prompt`` value, or an episode that ends before ``step``.
    """
    if step < 1:
        raise ValueError(f"--step {step}: the steps are numbered from 1 (the first prompt of an episode)")
    options = PromptOptions.from_config(prompt)
    config = EpisodeConfig(
        max_steps=max(50, step), history_length=history_length, max_prompt_length=10**9, prompt=options
    )
    env = make_task_env(TaskSpec(env_name, seed=seed, env_kwargs=dict(env_kwargs or {})), config)
    try:
        observation, info = env.reset(seed=seed)
        history: list[tuple[str, str]] = []
        for taken in range(step - 1):
            action = _next_action(env, info)
            command, _ = env.parse_action(env.example_reply(action))
            next_obs, _, terminated, truncated, info = env.step(command)
            history.append((observation, options.history_action(command, env.example_reply(action))))
            observation = next_obs
            if terminated or truncated:
                raise ValueError(f"{env_name} task {seed}: the sample episode ended after {taken + 1} steps")
        encoder = ChatPromptEncoder(tokenizer) if tokenizer is not None else (lambda text: [])
        images = len(info.get(IMAGE_INFO_KEY) or ())
        # the text and its ids without the images' tokens (a tokenizer has no processor to count them)
        text, ids, used, _ = build_prompt(env, observation, info, history, encoder, config, images=[])
    finally:
        env.close()
    return SamplePrompt(
        text=text, ids=ids if tokenizer is not None else None, taken=step - 1, history_used=used, images=images
    )


def overlong_note(tokens: int, limit: int, rule: str) -> str:
    """One line: whether ``tokens`` fit ``data.max_prompt_length=limit``, and what the engines do when not."""
    if tokens <= limit:
        return f"fits data.max_prompt_length={limit}"
    return (
        f"OVER data.max_prompt_length={limit} by {tokens - limit} tokens: under env.prompt.overlong={rule} "
        f"{OVERLONG_RULES[rule]}"
    )
