"""Build a tiny, randomly initialised vision-language chat model for CPU runs and tests — fully offline.

    python -m verl_gigpo.dev.tiny_vl_model --out artifacts/tiny-vl
    python -m verl_gigpo.dev.tiny_vl_model --out /tmp/vl --seed 1 --max-pixels 12544
    python -m verl_gigpo.dev.tiny_vl_model --out artifacts/tiny-vl-imitate --imitate gridnav:0.3 \
        --imitate-kwargs '{"observation": "image", "tile_size": 28, "size": 3, "walls": 0, "min_path": 1}'

Writes the tiny text model's tokenizer plus Qwen-VL's vision tokens, a ChatML template with image parts, an
images-only ``Qwen2_5_VLProcessor`` (:mod:`.tiny_vl_processor`) and a random ``Qwen2_5_VLForConditionalGeneration``;
loads with ``AutoProcessor`` and ``AutoModelForImageTextToText``. Sizes and why this family: docs/vision.md.
With ``--imitate ENV[:P]`` (:mod:`.tiny_model`'s options) it is then fine-tuned on the drawn environment's expert.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from verl_gigpo.dev.imitation import imitate_expert
from verl_gigpo.dev.tiny_model import (
    BOS_TOKEN,
    DEFAULT_ENVS,
    EOS_TOKEN,
    PAD_TOKEN,
    add_imitate_options,
    build_tokenizer,
    env_corpus,
    parse_imitate_options,
)

_REMOTE_MODULE = "processing_tiny_vl.py"

__all__ = ["VISION_TOKENS", "VL_CHAT_TEMPLATE", "build_tiny_vl_model", "main"]

logger = logging.getLogger(__name__)

#: Qwen-VL's vision special tokens, in the order their ids are added after the text vocabulary.
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")

#: ChatML with image/video parts: a message's content is a string or a list of ``{"type": "text"|"image"|"video"}``.
VL_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'video' %}{{ '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tiny_vl_model(
    out_dir: str | Path,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    intermediate_size: int = 128,
    vision_hidden_size: int = 32,
    vision_depth: int = 2,
    min_pixels: int = 56 * 56,
    max_pixels: int = 112 * 112,
    vocab_size: int = 2048,
    envs: Sequence[str] = DEFAULT_ENVS,
    seed: int = 0,
) -> Path:
    """Train the tokenizer, build a random ``Qwen2_5_VLForConditionalGeneration`` and its processor in ``out_dir``.

    ``hidden_size / num_heads`` must be 16 (mrope sections [2, 3, 3]); ``min_pixels``/``max_pixels`` bound the resize
    (multiples of 28x28 = one merged token). Returns ``out_dir``.
    """
    from transformers import (
        GenerationConfig,
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2VLImageProcessor,
    )

    from verl_gigpo.dev.tiny_vl_processor import Qwen2_5_VLProcessor

    if hidden_size // num_heads != 16 or hidden_size % num_heads:
        raise ValueError(
            f"hidden_size/num_heads must be 16 for mrope sections [2, 3, 3], got {hidden_size}/{num_heads}"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    texts, action_words, used = env_corpus(envs)
    tokenizer = build_tokenizer(texts, vocab_size=vocab_size, single_token_words=action_words)
    tokenizer.add_special_tokens({"additional_special_tokens": [BOS_TOKEN, *VISION_TOKENS]})
    tokenizer.chat_template = VL_CHAT_TEMPLATE
    ids = {name: tokenizer.convert_tokens_to_ids(tok) for name, tok in zip(VISION_TOKENS, VISION_TOKENS, strict=True)}
    special = {
        "bos_token_id": tokenizer.convert_tokens_to_ids(BOS_TOKEN),
        "eos_token_id": tokenizer.convert_tokens_to_ids(EOS_TOKEN),
        "pad_token_id": tokenizer.convert_tokens_to_ids(PAD_TOKEN),
    }
    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": hidden_size,
            "intermediate_size": intermediate_size,
            "num_hidden_layers": num_layers,
            "num_attention_heads": num_heads,
            "num_key_value_heads": num_heads,
            "max_position_embeddings": 4096,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
            "tie_word_embeddings": True,
            **special,
        },
        vision_config={
            "depth": vision_depth,
            "hidden_size": vision_hidden_size,
            "intermediate_size": 2 * vision_hidden_size,
            "num_heads": 2,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "window_size": 56,
            "out_hidden_size": hidden_size,
            "fullatt_block_indexes": [vision_depth - 1],
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
        **special,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2_5_VLForConditionalGeneration(config)
    model.generation_config = GenerationConfig(**special)
    image_processor = Qwen2VLImageProcessor(
        patch_size=14, merge_size=2, temporal_patch_size=2, min_pixels=min_pixels, max_pixels=max_pixels
    )
    processor = Qwen2_5_VLProcessor(
        image_processor=image_processor, tokenizer=tokenizer, chat_template=VL_CHAT_TEMPLATE
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    processor.save_pretrained(out)
    _write_remote_processor(out)
    info = {
        "builder": "verl_gigpo.dev.tiny_vl_model",
        "family": "qwen2_5_vl",
        "seed": seed,
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "corpus_envs": used,
        "single_token_actions": action_words,
        "min_pixels": min_pixels,
        "max_pixels": max_pixels,
    }
    (out / "tiny_model_info.json").write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
    logger.info("tiny VL model (%d parameters, vocab %d) written to %s", info["parameters"], len(tokenizer), out)
    return out


def _write_remote_processor(out: Path) -> None:
    """Copy the images-only processor class into ``out`` and point ``AutoProcessor`` at it (``auto_map``)."""
    from verl_gigpo.dev import tiny_vl_processor

    (out / _REMOTE_MODULE).write_text(Path(tiny_vl_processor.__file__).read_text())
    auto_map = {"AutoProcessor": f"{_REMOTE_MODULE[:-3]}.Qwen2_5_VLProcessor"}
    for name in ("processor_config.json", "preprocessor_config.json", "tokenizer_config.json"):
        path = out / name
        if path.exists():
            data = json.loads(path.read_text())
            data["auto_map"] = {**data.get("auto_map", {}), **auto_map}
            path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description="Build a tiny random Qwen2.5-VL chat model with a local tokenizer")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--seed", type=int, default=0, help="weight initialisation seed")
    parser.add_argument("--max-pixels", type=int, default=112 * 112, help="image processor's resize cap (pixels)")
    parser.add_argument("--envs", default=",".join(DEFAULT_ENVS), help="comma-separated environments for the corpus")
    add_imitate_options(parser)
    args = parser.parse_args(argv)
    if args.max_pixels < 56 * 56:
        parser.error(f"--max-pixels must be >= {56 * 56} (one 56x56 image), got {args.max_pixels}")
    imitate = parse_imitate_options(parser, args) if args.imitate is not None else None
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    out = build_tiny_vl_model(
        args.out, max_pixels=args.max_pixels, envs=[e for e in args.envs.split(",") if e], seed=args.seed
    )
    if imitate is not None:
        imitate_expert(out, **imitate, seed=args.seed)
    info = json.loads((out / "tiny_model_info.json").read_text())
    print(f"tiny VL model: {info['parameters']:,} parameters, vocab {info['vocab_size']}, written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
