"""``benchmarks/memory_table.py``: its parameter counts against the models transformers and PEFT build, a
hand-computed case of the memory formulas, and docs/models.md holding exactly what the script prints."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import (
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    Qwen2_5_VLConfig,
    Qwen2Config,
    Qwen2VLConfig,
    Qwen3Config,
    Qwen3VLConfig,
)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import memory_table  # noqa: E402
from memory_table import MODELS, ModelSpec, actor_gib, smallest_card_gib  # noqa: E402

GIB = 2**30


def hf_model(spec: ModelSpec):
    """The model of ``spec`` as transformers builds it (Qwen2 or Qwen3 architecture), on the meta device (no
    memory)."""
    common = {
        "hidden_size": spec.hidden,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "intermediate_size": spec.intermediate,
        "vocab_size": spec.vocab,
        "tie_word_embeddings": spec.tied,
    }
    if spec.vision is not None:
        return hf_vl_model(spec, common)
    config = Qwen3Config(head_dim=spec.head_dim, **common) if spec.qk_norm else Qwen2Config(**common)
    assert config.head_dim == spec.head_dim if spec.qk_norm else spec.hidden // spec.heads == spec.head_dim
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def hf_vl_model(spec: ModelSpec, common: dict):
    """A vision-language ``spec`` as transformers builds it (Qwen2-VL, Qwen2.5-VL or Qwen3-VL), on the meta device."""
    v, tied = spec.vision, common.pop("tie_word_embeddings")
    if v.family == "qwen2_vl":
        vision = {"embed_dim": v.hidden, "mlp_ratio": v.intermediate // v.hidden, "hidden_size": v.out}
        config = Qwen2VLConfig(text_config=common, vision_config={**vision, "depth": v.depth}, tie_word_embeddings=tied)
    elif v.family == "qwen2_5_vl":
        vision = {"hidden_size": v.hidden, "intermediate_size": v.intermediate, "out_hidden_size": v.out}
        config = Qwen2_5_VLConfig(
            text_config=common, vision_config={**vision, "depth": v.depth}, tie_word_embeddings=tied
        )
    else:
        vision = {
            "hidden_size": v.hidden,
            "intermediate_size": v.intermediate,
            "out_hidden_size": v.out,
            "patch_size": v.patch,
            "num_position_embeddings": v.positions,
            "deepstack_visual_indexes": list(range(v.deepstack)),
        }
        config = Qwen3VLConfig(
            text_config={**common, "head_dim": spec.head_dim},
            vision_config={**vision, "depth": v.depth},
            tie_word_embeddings=tied,
        )
    with torch.device("meta"):
        return AutoModelForImageTextToText.from_config(config)


@pytest.mark.parametrize("spec", MODELS, ids=lambda s: s.name)
def test_parameter_count_is_the_one_transformers_builds(spec):
    assert sum(p.numel() for p in hf_model(spec).parameters()) == spec.params()


@pytest.mark.parametrize("spec", MODELS, ids=lambda s: s.name)
def test_lora_count_is_the_one_peft_builds(spec):
    """PEFT's ``all-linear`` adapter on two decoder layers (the count is per layer, so two layers check it)."""
    short = dataclasses.replace(spec, layers=2)
    task = {"task_type": "CAUSAL_LM"}
    if spec.vision is not None:  # all-linear adapts the vision tower's linear layers too: two of its blocks
        short, task = dataclasses.replace(short, vision=dataclasses.replace(spec.vision, depth=2)), {}
    model = get_peft_model(hf_model(short), LoraConfig(r=8, lora_alpha=8, target_modules="all-linear", **task))
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == short.lora_params(8)


def test_hand_computed_memory_of_qwen25_15b():
    """Qwen2.5-1.5B: P = 1,543,714,304 (28 layers of 46,797,824 + a tied 151,936 x 1,536 embedding + the final norm).
    Full fine-tuning on 1 GPU: 12 B/param between updates, 16 during one; the card needs (12 P + 2 GiB) / 0.4."""
    spec = next(m for m in MODELS if m.name == "Qwen2.5-1.5B-Instruct")
    p = 28 * 46_797_824 + 151_936 * 1_536 + 1_536
    assert spec.params() == p == 1_543_714_304
    assert actor_gib(spec, 1, 0, update=False) == pytest.approx(12 * p / GIB)
    assert actor_gib(spec, 2, 0, update=True) == pytest.approx(16 * p / 2 / GIB)
    assert smallest_card_gib(spec, 1, 0, 0.6, 1) == pytest.approx((12 * p / GIB + 2) / 0.4)
    # 8 GPUs: the actor's share is small, vLLM's whole bf16 copy per GPU bounds the card: (2 P + 2 GiB) / 0.6
    assert smallest_card_gib(spec, 8, 0, 0.6, 1) == pytest.approx(
        max((12 * p / 8 / GIB + 2) / 0.4, (2 * p / GIB + 2) / 0.6)
    )
    # LoRA: the frozen fp32 base (4 B/param) plus 12 B per adapter parameter
    lora = spec.lora_params(64)
    assert actor_gib(spec, 1, 64, update=False) == pytest.approx((4 * p + 12 * lora) / GIB)


def test_docs_hold_the_tables_the_script_prints():
    """docs/models.md shows the script's output; a change of the recipes' settings or the formulas shows up here
    (regenerate with ``python benchmarks/memory_table.py --write``)."""
    doc = (ROOT / "docs" / "models.md").read_text()
    block = doc.split(memory_table.BEGIN, 1)[1].split(memory_table.END, 1)[0]
    assert block == "\n" + memory_table.tables()
