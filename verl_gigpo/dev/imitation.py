"""Supervised fine-tuning of a tiny model (:mod:`verl_gigpo.dev.tiny_model`) into a starting policy for RL:
:func:`sft_action_format` (``--sft-actions``: random action words, the action format) and :func:`imitate_expert`
(``--imitate ENV[:P]``: the expert's action with probability P). Both fine-tune the folder in place (AdamW on the
reply tokens only) and record it in ``tiny_model_info.json``. docs/models.md ("The tiny models").
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from environments.images import IMAGE_INFO_KEY
from verl_gigpo.config.rules import Range
from verl_gigpo.dev.walks import walk

__all__ = ["IMITATE_P", "action_probabilities", "expert_examples", "imitate_expert", "sft_action_format"]

logger = logging.getLogger(__name__)

#: ``--imitate``: share of expert labels (the rest uniformly random), chosen so that the learning benchmark's key
#: task starts at a low but non-zero validation success (benchmarks/RESULTS.md, "Start models").
IMITATE_P = 0.7


def sft_action_format(
    model_dir: str | Path,
    *,
    env_name: str = "gridnav",
    steps: int = 40,
    batch_size: int = 16,
    lr: float = 3e-3,
    seed: int = 0,
) -> Path:
    """Fine-tune ``model_dir`` in place to reply to ``env_name`` prompts with a uniformly random action word + EOS.

    ``steps`` AdamW steps of ``batch_size`` examples (:func:`_sft_examples`); returns ``model_dir``.

    Raises:
        ValueError: ``steps`` or ``batch_size`` < 1, or an environment without admissible actions.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps ({steps}) and batch_size ({batch_size}) must be >= 1")
    model_dir = Path(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    rng = np.random.default_rng(seed)
    examples = _sft_examples(env_name, tokenizer, rng)
    width = max(len(p) + len(t) for p, t in examples)
    _supervised_steps(
        model, tokenizer.pad_token_id, examples, rng, steps=steps, batch_size=batch_size, lr=lr, seed=seed, width=width
    )
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    info_path = model_dir / "tiny_model_info.json"
    info = json.loads(info_path.read_text()) if info_path.exists() else {}
    info["sft_actions"] = {"env": env_name, "steps": steps, "batch_size": batch_size, "lr": lr, "seed": seed}
    info_path.write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
    logger.info("fine-tuned %s to answer %s prompts with a random action (%d steps)", model_dir, env_name, steps)
    return model_dir


def _sft_examples(env_name: str, tokenizer, rng: np.random.Generator) -> list[tuple[list[int], list[int]]]:
    """``(prompt ids, target ids)``: 64 seeded tasks, up to 3 random-walk steps each, target a random action + EOS."""
    from environments import make_env
    from verl_gigpo.rollout import ChatPromptEncoder

    encoder = ChatPromptEncoder(tokenizer)
    env = make_env(env_name, max_steps=10)
    examples = []

    def choose(obs: str, info: dict, history: list) -> str:
        actions = list(info.get("admissible_actions") or [])
        if not actions:
            raise ValueError(f"{env_name} lists no admissible actions; --sft-actions needs a fixed action set")
        action = actions[int(rng.integers(len(actions)))]
        prompt = encoder(env.render_prompt(obs, info))
        examples.append((prompt, tokenizer.encode(action, add_special_tokens=False) + [tokenizer.eos_token_id]))
        return action

    for task_seed in range(64):
        walk(env, task_seed, choose, steps=3)
    return examples


def imitate_expert(
    model_dir: str | Path,
    *,
    env_name: str = "gridnav",
    env_kwargs: dict | None = None,
    p_expert: float = IMITATE_P,
    steps: int = 400,
    tasks: int = 400,
    batch_size: int = 32,
    lr: float = 3e-3,
    follow: float = 0.7,
    max_steps: int = 15,
    history_length: int = 0,
    seed: int = 0,
) -> Path:
    """Fine-tune ``model_dir`` in place into a weak policy that reads its observation; returns ``model_dir``.

    Label at each state of a walk through tasks ``0 .. tasks-1``: the expert's ``oracle_action()`` with probability
    ``p_expert``, else a random admissible action; the walk follows the label with probability ``follow``. Prompts as
    the engines render them (``history_length``); the loss covers the label word + EOS. Deterministic.
    A vision-language model is fine-tuned on an environment that draws its observation, with its processor.

    Raises:
        ValueError: a probability outside [0, 1], a count < 1, or an environment without ``oracle_action()`` or a
            fixed action set.
    """
    from verl_gigpo.rollout.vision import load_pretrained

    for name, value in (("p_expert", p_expert), ("follow", follow)):
        Range(name, "float", "a probability", low=0, high=1).check(value)
    for name, value in (("steps", steps), ("tasks", tasks), ("batch_size", batch_size), ("max_steps", max_steps)):
        Range(name, "int", "a count", low=1).check(value)
    Range("history_length", "int", "past steps shown in the prompt", low=0).check(history_length)
    model_dir = Path(model_dir)
    model, processor = load_pretrained(str(model_dir), trust_remote_code=True)  # the tiny VL processor's class
    if processor is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    else:
        tokenizer = processor.tokenizer
    rng = np.random.default_rng(seed)
    examples = expert_examples(
        env_name,
        tokenizer,
        rng,
        env_kwargs=env_kwargs,
        p_expert=p_expert,
        tasks=tasks,
        follow=follow,
        max_steps=max_steps,
        history_length=history_length,
        processor=processor,
    )
    _supervised_steps(
        model,
        tokenizer.pad_token_id,
        examples,
        rng,
        steps=steps,
        batch_size=batch_size,
        lr=lr,
        seed=seed,
        image_processor=None if processor is None else processor.image_processor,
    )
    model.save_pretrained(model_dir)
    if processor is None:  # a VL folder's tokenizer files also name its processor class: left as built
        tokenizer.save_pretrained(model_dir)
    info_path = model_dir / "tiny_model_info.json"
    info = json.loads(info_path.read_text()) if info_path.exists() else {}
    info["imitate"] = {
        "env": env_name,
        "env_kwargs": dict(env_kwargs or {}),
        "p_expert": p_expert,
        "follow": follow,
        "tasks": tasks,
        "examples": len(examples),
        "max_steps": max_steps,
        "history_length": history_length,
        "steps": steps,
        "batch_size": batch_size,
        "lr": lr,
        "seed": seed,
    }
    info_path.write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
    logger.info(
        "fine-tuned %s to imitate the %s expert (p=%.2f, %d examples)", model_dir, env_name, p_expert, len(examples)
    )
    return model_dir


def expert_examples(
    env_name: str,
    tokenizer,
    rng: np.random.Generator,
    *,
    env_kwargs: dict | None = None,
    p_expert: float = IMITATE_P,
    tasks: int = 400,
    follow: float = 0.7,
    max_steps: int = 15,
    history_length: int = 0,
    processor: Any = None,
) -> list[tuple]:
    """``(prompt ids, target ids, label is the expert's)`` for every state of one walk per task, as
    :func:`imitate_expert` labels them; with a ``processor`` and a drawn observation, ``(..., the state's images)``.
    ValueError: no ``oracle_action()``, no admissible actions, or a drawn observation without a processor."""
    from environments import make_env
    from verl_gigpo.rollout import ChatPromptEncoder

    encoder = ChatPromptEncoder(tokenizer, processor=processor)
    env = make_env(env_name, max_steps=max_steps, **dict(env_kwargs or {}))
    drawn = getattr(env, "images_per_step", 0) > 0
    if drawn and processor is None:
        raise ValueError(f"{env_name} draws its observation: imitation needs a vision-language model's processor")
    if not callable(getattr(env, "oracle_action", None)):
        raise ValueError(f"{env_name} has no oracle_action(): --imitate needs an environment with an expert")
    examples = []

    def choose(obs: str, info: dict, history: list) -> str:
        actions = list(info.get("admissible_actions") or [])
        if not actions:
            raise ValueError(f"{env_name} lists no admissible actions; --imitate needs a fixed action set")
        expert = env.oracle_action()
        is_expert = bool(rng.random() < p_expert)
        label = expert if is_expert else actions[int(rng.integers(len(actions)))]
        shown = history[len(history) - history_length :] if history_length else []
        text = env.render_prompt(obs, info, shown)
        target = tokenizer.encode(label, add_special_tokens=False) + [tokenizer.eos_token_id]
        if drawn:
            images = tuple(info[IMAGE_INFO_KEY])
            examples.append((encoder.encode_with_images(text, images), target, is_expert, images))
        else:
            examples.append((encoder(text), target, is_expert))
        return label if rng.random() < follow else actions[int(rng.integers(len(actions)))]  # the move taken

    try:
        for task_seed in range(tasks):
            walk(env, task_seed, choose, options={"split": "train"})
    finally:
        env.close()
    return examples


def action_probabilities(
    model_dir: str | Path,
    *,
    env_name: str = "gridnav",
    env_kwargs: dict | None = None,
    seeds: Sequence[int] = (0, 1, 2, 3),
    split: str = "test",
    max_steps: int = 15,
) -> list[dict]:
    """First-token probability of each action word at the first state of each seed's task: one dict per seed,
    ``{"observation", "expert", "probs": {action: p}, "other": 1 - sum(probs)}`` (``expert`` None without an oracle)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from environments import make_env
    from verl_gigpo.rollout import ChatPromptEncoder

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    encoder = ChatPromptEncoder(tokenizer)
    env = make_env(env_name, max_steps=max_steps, **dict(env_kwargs or {}))
    rows = []
    try:
        for seed in seeds:
            obs, info = env.reset(seed=int(seed), options={"split": split})
            actions = list(info.get("admissible_actions") or [])
            ids = torch.tensor([encoder(env.render_prompt(obs, info))])  # (1, P)
            with torch.no_grad():
                probs = torch.softmax(model(input_ids=ids).logits[0, -1].float(), dim=-1)  # (V,)
            first = {a: tokenizer.encode(a, add_special_tokens=False)[0] for a in actions}
            scored = {a: float(probs[t]) for a, t in first.items()}
            oracle = getattr(env, "oracle_action", None)
            rows.append(
                {
                    "observation": obs,
                    "expert": oracle() if callable(oracle) else None,
                    "probs": scored,
                    "other": max(0.0, 1.0 - sum(scored.values())),
                }
            )
    finally:
        env.close()
    return rows


def _supervised_steps(
    model,
    pad_id: int,
    examples: Sequence[tuple[list[int], ...]],
    rng: np.random.Generator,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    width: int | None = None,
    image_processor: Any = None,
) -> None:
    """``steps`` AdamW steps on batches drawn by ``rng`` (right-padded to ``width``), loss on the targets, under a torch
    RNG seeded with ``seed``. With ``image_processor`` each example's fourth item is its images, forwarded with
    Qwen-VL's 4-row positions."""
    from verl_gigpo.rollout.vision import image_inputs, rope_positions

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
        model.train()
        for _ in range(steps):
            drawn = [examples[int(i)] for i in rng.integers(len(examples), size=batch_size)]
            batch = [example[:2] for example in drawn]
            pad_to = width if width is not None else max(len(p) + len(t) for p, t in batch)
            ids, attention, labels = _right_padded(batch, pad_to, pad_id)  # (B, W) each
            if image_processor is None:
                loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
            else:
                vision = image_inputs(image_processor, [image for example in drawn for image in example[3]])
                positions = rope_positions(model, ids, attention, vision["image_grid_thw"])  # (4, B, W)
                loss = model(
                    input_ids=ids, attention_mask=attention, position_ids=positions, labels=labels, **vision
                ).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval()


def _right_padded(
    batch: Sequence[tuple[list[int], list[int]]], width: int, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask, labels)``, each (B, W): prompt + target, right-padded; labels -100 off targets."""
    ids = torch.full((len(batch), width), pad_id)  # (B, W)
    labels = torch.full((len(batch), width), -100)  # (B, W)
    attention = torch.zeros((len(batch), width), dtype=torch.long)  # (B, W)
    for row, (prompt, target) in enumerate(batch):
        n = len(prompt) + len(target)
        ids[row, :n] = torch.tensor(prompt + target)
        labels[row, len(prompt) : n] = torch.tensor(target)
        attention[row, :n] = 1
    return ids, attention, labels
