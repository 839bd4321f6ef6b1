"""CPU tests of LoRA merging (``verl_gigpo.verl_glue.lora``) against peft, the library verl's FSDP actor trains adapters
with.

The oracle is peft itself: a real ``LoraConfig`` adapter on the tiny Qwen2 model, with random ``A`` and ``B`` (peft
starts ``B`` at zero, which would make every merge trivially right), merged by peft's ``merge_and_unload``.
"""

from __future__ import annotations

import math

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from verl_gigpo.verl_glue.lora import adapted_weight_name, lora_scale, merge_lora

Q = "model.layers.0.self_attn.q_proj.weight"


def _peft_model(model_dir, **config):
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    lora = LoraConfig(target_modules="all-linear", **config)
    model = get_peft_model(base, lora)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.1)
    return model, lora


@pytest.mark.parametrize("config", [{"r": 4, "lora_alpha": 8}, {"r": 4, "lora_alpha": 8, "use_rslora": True}])
def test_merge_equals_peft_merge_and_unload(tiny_model_dir, config):
    model, lora = _peft_model(tiny_model_dir, **config)
    state = model.state_dict()  # peft names: base_model.model.<layer>.base_layer.weight, <layer>.lora_A.default.weight
    base = {k.replace("base_model.model.", "").replace(".base_layer.", "."): v.clone() for k, v in state.items()}
    adapter = {k: v for k, v in state.items() if "lora_" in k}
    merged = merge_lora(base, adapter, lora.to_dict())
    expected = model.merge_and_unload().state_dict()
    adapted = {adapted_weight_name(k)[0] for k in adapter}
    assert set(merged) == adapted and len(adapted) == 14  # 7 linear layers x 2 blocks; lm_head is not adapted
    for name in adapted:
        torch.testing.assert_close(merged[name], expected[name], rtol=0, atol=0, msg=name)
        assert not torch.equal(merged[name], base[name])


def test_scale_is_alpha_over_rank_or_over_its_root_with_rslora():
    assert lora_scale({"r": 8, "lora_alpha": 16}) == 2.0
    assert lora_scale({"r": 64, "lora_alpha": 64}) == 1.0
    assert lora_scale({"r": 16, "lora_alpha": 8, "use_rslora": True}) == pytest.approx(8 / math.sqrt(16))


def test_adapter_names_of_checkpoints_syncs_and_the_merger_map_to_the_adapted_weight():
    for name in (
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight",  # verl's checkpoint
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",  # verl's weight sync, its model merger
        "model.layers.0.self_attn.q_proj.lora_A.weight",
    ):
        assert adapted_weight_name(name) == (Q, "A")
    assert adapted_weight_name("base_model.model.model.layers.0.mlp.up_proj.lora_B.default.weight") == (
        "model.layers.0.mlp.up_proj.weight",
        "B",
    )
    assert adapted_weight_name("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight") is None
    assert adapted_weight_name("model.embed_tokens.weight") is None


@pytest.mark.parametrize(
    ("config", "error", "match"),
    [
        ({"r": 4, "lora_alpha": 8, "use_dora": True}, NotImplementedError, "use_dora=True"),
        ({"r": 4, "lora_alpha": 8, "rank_pattern": {"q_proj": 8}}, NotImplementedError, "rank_pattern="),
        ({"r": 4, "lora_alpha": 0}, ValueError, "lora_alpha=0"),
        ({"r": 0, "lora_alpha": 8}, ValueError, "r=0"),
    ],
)
def test_lora_variants_the_formula_does_not_cover_are_refused(config, error, match):
    with pytest.raises(error, match=match):
        lora_scale(config)


def test_incomplete_or_misshapen_adapters_are_refused():
    base = {Q: torch.zeros(6, 5)}
    a, b = torch.ones(2, 5), torch.ones(6, 2)
    config = {"r": 2, "lora_alpha": 2}
    with pytest.raises(ValueError, match="has lora_A only"):
        merge_lora(base, {"model.layers.0.self_attn.q_proj.lora_A.weight": a}, config)
    with pytest.raises(ValueError, match=r"adapter of model\.x\.weight: .*no weight"):
        merge_lora(base, {"model.x.lora_A.weight": a, "model.x.lora_B.weight": b}, config)
    with pytest.raises(ValueError, match=r"A \(2, 5\), B \(5, 2\) do not fit W \(6, 5\)"):
        merge_lora(base, {Q.replace("weight", "lora_A.weight"): a, Q.replace("weight", "lora_B.weight"): b[:5]}, config)
    with pytest.raises(ValueError, match=rf"{Q!r} .*lora_A/lora_B"):
        merge_lora(base, {Q: a}, config)
    merged = merge_lora(
        base, {Q.replace("weight", "lora_A.weight"): a, Q.replace("weight", "lora_B.weight"): b}, config
    )
    torch.testing.assert_close(merged[Q], torch.full((6, 5), 2.0))  # s = 1; (B A)_ij = r = 2
