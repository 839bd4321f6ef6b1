"""Build a tiny, randomly initialised chat model for CPU runs, tests and the demo — fully offline.

    python -m verl_gigpo.dev.tiny_model --out artifacts/tiny-model
    python -m verl_gigpo.dev.tiny_model --out artifacts/tiny-model-actions --envs gridnav --sft-actions
    python -m verl_gigpo.dev.tiny_model --out artifacts/tiny-model-imitate --envs gridnav --imitate gridnav:0.7 \
        --imitate-kwargs '{"key": true, "observe": "target", "size": 5, "walls": [2, 4], "min_path": 5}'

A BPE tokenizer trained on the environments' prompts (action words single tokens), a ChatML template and a ~1.3M
parameter ``Qwen2ForCausalLM``; ``--sft-actions`` and ``--imitate`` fine-tune it (:mod:`verl_gigpo.dev.imitation`).
Deterministic. What each option gives: docs/models.md ("The tiny models").
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verl_gigpo.dev.imitation import (  # re-exported: the fine-tuning the CLI runs (--sft-actions, --imitate)
    IMITATE_P,
    action_probabilities,
    expert_examples,
    imitate_expert,
    sft_action_format,
)
from verl_gigpo.dev.walks import walk

__all__ = [
    "CHAT_TEMPLATE",
    "IMITATE_P",
    "action_probabilities",
    "DEFAULT_ENVS",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "build_tiny_model",
    "build_tokenizer",
    "env_corpus",
    "expert_examples",
    "imitate_expert",
    "main",
    "sft_action_format",
]

logger = logging.getLogger(__name__)

#: Environments whose prompts train the tokenizer when they can be built without external data.
DEFAULT_ENVS: tuple[str, ...] = ("gridnav", "sokoban", "webshop", "search")

EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"
BOS_TOKEN = "<|im_start|>"
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN)
# the model config's and generation config's special-token fields
_SPECIAL_IDS = {"bos_token_id": BOS_TOKEN, "eos_token_id": EOS_TOKEN, "pad_token_id": PAD_TOKEN}

#: ChatML, the format of Qwen2 chat models (system/user/assistant turns; the generation prompt opens an
#: assistant turn).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

#: Words every reply format uses; kept frequent so that they become single tokens.
_FORMAT_WORDS = ("<action>", "</action>", "<think>", "</think>", "user", "assistant", "system")


def env_corpus(
    env_names: Iterable[str] = DEFAULT_ENVS, *, seeds: int = 24, walk_steps: int = 6, rng_seed: int = 0
) -> tuple[list[str], list[str], list[str]]:
    """Prompts of seeded random walks (``seeds`` tasks of ``walk_steps`` example actions) of each buildable environment.

    Returns ``(texts, action_words, used_envs)``: the rendered prompts and actions, the fixed action words (made single
    tokens), the environments built (the others are skipped with a warning).
    """
    from environments import make_env

    texts: list[str] = []
    action_words: set[str] = set()
    used: list[str] = []
    rng = np.random.default_rng(rng_seed)
    for name in env_names:
        try:
            env = make_env(name)
        except (ImportError, ValueError, OSError, RuntimeError) as exc:
            logger.warning("tokenizer corpus: skipping environment %r (%s: %s)", name, type(exc).__name__, exc)
            continue
        used.append(name)
        seen_actions = _walk_texts(env, seeds, walk_steps, rng, texts)
        # a small fixed action vocabulary of single words: make each word one token
        if 0 < len(seen_actions) <= 16 and all(a.isalpha() for a in seen_actions):
            action_words.update(seen_actions)
    return texts, sorted(action_words), used


def _walk_texts(env: Any, seeds: int, walk_steps: int, rng: np.random.Generator, texts: list[str]) -> set[str]:
    """Append the prompts and replies of ``env``'s seeded random walks to ``texts``, then close it; the actions seen."""
    seen_actions: set[str] = set()

    def choose(obs: str, info: dict, history: list) -> str | None:
        texts.append(env.render_prompt(obs, info, history[-1:]))
        choices = env.example_actions()
        if not choices:
            return None
        action = choices[int(rng.integers(len(choices)))]
        seen_actions.update(choices)
        texts.append(f"<think>ok</think><action>{action}</action>")
        return action

    try:
        for seed in range(seeds):
            walk(env, seed, choose, steps=walk_steps)
    finally:
        env.close()
    return seen_actions


def build_tokenizer(texts: Sequence[str], *, vocab_size: int = 2048, single_token_words: Sequence[str] = ()):
    """Train a byte-level BPE tokenizer of ``vocab_size`` on ``texts`` as a ``PreTrainedTokenizerFast``; each of
    ``single_token_words`` is one token, alone and after a space (ValueError when one still splits)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    # the same normalizer and pre-tokenizer as Qwen2's tokenizer class, which AutoTokenizer picks for a Qwen2
    # model directory: training and use then split text identically (digits are single pre-tokens there)
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    boost = [" ".join(_FORMAT_WORDS), "\n".join(_FORMAT_WORDS)] * 200
    for word in single_token_words:
        boost += [f"{word}\n{word} {word}"] * 500
    tok.train_from_iterator(list(texts) + boost, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        bos_token=None,
        unk_token=None,
        additional_special_tokens=[BOS_TOKEN],
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
        padding_side="left",
    )
    wrapped.chat_template = CHAT_TEMPLATE
    split = [
        w for w in single_token_words for t in (w, " " + w) if len(wrapped.encode(t, add_special_tokens=False)) != 1
    ]
    if split:
        raise ValueError(f"action words {split} are not single tokens at vocab_size={vocab_size}; raise vocab_size")
    return wrapped


# a little over 60 lines only because its eleven keyword arguments and their docs are half of it
def build_tiny_model(
    out_dir: str | Path,
    *,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int | None = None,
    intermediate_size: int = 512,
    vocab_size: int = 2048,
    max_position_embeddings: int = 4096,
    envs: Sequence[str] = DEFAULT_ENVS,
    corpus_seeds: int = 24,
    seed: int = 0,
) -> Path:
    """Train the tokenizer, build a random ``Qwen2ForCausalLM`` (``Qwen2Config`` sizes, weights from ``seed``, the
    global torch RNG left as it was) and save both to ``out_dir``; returns it."""
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads})")
    kv_heads = num_heads if num_kv_heads is None else num_kv_heads
    if num_heads % kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({kv_heads})")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    texts, action_words, used = env_corpus(envs, seeds=corpus_seeds)
    if not texts:
        logger.warning("no environment could be built for the tokenizer corpus; using the format words only")
    tokenizer = build_tokenizer(texts, vocab_size=vocab_size, single_token_words=action_words)
    model = _random_qwen2(
        tokenizer,
        seed=seed,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_position_embeddings,
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    info = {
        "builder": "verl_gigpo.dev.tiny_model",
        "seed": seed,
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "corpus_envs": used,
        "single_token_actions": action_words,
    }
    (out / "tiny_model_info.json").write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
    logger.info("tiny model (%d parameters, vocab %d) written to %s", info["parameters"], len(tokenizer), out)
    return out


def _random_qwen2(tokenizer, *, seed: int, **sizes: int):
    """A tied-embedding ``Qwen2ForCausalLM`` over ``tokenizer``'s vocabulary with weights drawn from ``seed``."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    ids = {name: tokenizer.convert_tokens_to_ids(tok) for name, tok in _SPECIAL_IDS.items()}
    config = Qwen2Config(vocab_size=len(tokenizer), **sizes, tie_word_embeddings=True, **ids)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(**ids)
    return model


def add_imitate_options(parser: argparse.ArgumentParser) -> None:
    """``--imitate ENV[:P]`` and the ``--imitate-*`` options (read back by :func:`parse_imitate_options`)."""
    parser.add_argument(
        "--imitate",
        default=None,
        metavar="ENV[:P]",
        help="then fine-tune into a weak policy imitating ENV's shortest-path expert: the expert's action with "
        f"probability P (default {IMITATE_P}), a random one otherwise (e.g. gridnav:0.7)",
    )
    parser.add_argument(
        "--imitate-kwargs", default="{}", metavar="JSON", help="environment arguments, e.g. '{\"key\": true}'"
    )
    parser.add_argument("--imitate-steps", type=int, default=400, help="supervised steps (batch 32)")
    parser.add_argument("--imitate-tasks", type=int, default=400, help="training tasks walked for examples")
    parser.add_argument("--imitate-max-steps", type=int, default=15, help="step limit of each walk")
    parser.add_argument(
        "--imitate-history", type=int, default=0, help="past steps shown in each prompt (as env.history_length)"
    )


def parse_imitate_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict:
    """The keyword arguments of :func:`imitate_expert` from ``--imitate ENV[:P]`` and the ``--imitate-*`` options."""
    env_name, _, p_text = args.imitate.partition(":")
    if not env_name:
        parser.error(f"--imitate takes ENV[:P], e.g. gridnav:0.7; got {args.imitate!r}")
    try:
        p_expert = float(p_text) if p_text else IMITATE_P
    except ValueError:
        parser.error(f"--imitate {args.imitate}: P must be a number in [0, 1], got {p_text!r}")
    if not 0.0 <= p_expert <= 1.0:
        parser.error(f"--imitate {args.imitate}: P must be in [0, 1], got {p_expert}")
    from environments import kwargs_from_json

    try:
        env_kwargs = kwargs_from_json(args.imitate_kwargs, "--imitate-kwargs")
    except ValueError as exc:
        parser.error(str(exc))
    for option in ("imitate_steps", "imitate_tasks", "imitate_max_steps"):
        if getattr(args, option) < 1:
            parser.error(f"--{option.replace('_', '-')} must be >= 1, got {getattr(args, option)}")
    if args.imitate_history < 0:
        parser.error(f"--imitate-history must be >= 0, got {args.imitate_history}")
    return {
        "env_name": env_name,
        "env_kwargs": env_kwargs,
        "p_expert": p_expert,
        "steps": args.imitate_steps,
        "tasks": args.imitate_tasks,
        "max_steps": args.imitate_max_steps,
        "history_length": args.imitate_history,
    }


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit status."""
    parser = argparse.ArgumentParser(
        description="Build a tiny random Qwen2 chat model with a locally trained tokenizer"
    )
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=None, help="key/value heads (default: --heads)")
    parser.add_argument("--intermediate-size", type=int, default=512)
    parser.add_argument("--vocab-size", type=int, default=2048)
    parser.add_argument("--envs", default=",".join(DEFAULT_ENVS), help="comma-separated environments for the corpus")
    parser.add_argument("--seed", type=int, default=0, help="weight initialisation seed")
    parser.add_argument(
        "--sft-actions",
        type=int,
        nargs="?",
        const=40,
        default=0,
        metavar="STEPS",
        help="then fine-tune to answer gridnav prompts with a random action word (default 40 steps)",
    )
    add_imitate_options(parser)
    args = parser.parse_args(argv)
    if args.sft_actions < 0:
        parser.error(f"--sft-actions takes a number of steps >= 1, got {args.sft_actions}")
    imitate = parse_imitate_options(parser, args) if args.imitate is not None else None
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    out = build_tiny_model(
        args.out,
        hidden_size=args.hidden_size,
        num_layers=args.layers,
        num_heads=args.heads,
        num_kv_heads=args.kv_heads,
        intermediate_size=args.intermediate_size,
        vocab_size=args.vocab_size,
        envs=[e for e in args.envs.split(",") if e],
        seed=args.seed,
    )
    if args.sft_actions:
        sft_action_format(out, steps=args.sft_actions, seed=args.seed)
    if imitate is not None:
        imitate_expert(out, **imitate, seed=args.seed)
        print("first-token action probabilities at the first state of test tasks 0-3 (the expert's marked *):")
        for row in action_probabilities(
            out, env_name=imitate["env_name"], env_kwargs=imitate["env_kwargs"], max_steps=imitate["max_steps"]
        ):
            probs = " ".join(f"{a}{'*' if a == row['expert'] else ''} {p:.2f}" for a, p in row["probs"].items())
            print(f"  {row['observation']!r}: {probs} (other tokens {row['other']:.2f})")
    info = json.loads((out / "tiny_model_info.json").read_text())
    print(f"tiny model: {info['parameters']:,} parameters, vocab {info['vocab_size']}, corpus {info['corpus_envs']}")
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
