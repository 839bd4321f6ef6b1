"""LoRA adapters as verl trains them (peft's LoRA on linear layers), merged into full weights.

Notation (LoRA, Hu et al. 2021, arXiv 2106.09685; peft's ``LoraLayer``): a linear layer ``y = x W^T + b`` with
``W`` of shape ``(out, in)`` gets an adapter ``A`` ``(r, in)`` and ``B`` ``(out, r)``. In evaluation mode (no
dropout) the adapted layer computes

    y = x W^T + b + s (x A^T) B^T,      s = alpha / r   (alpha / sqrt(r) with rsLoRA)

which equals the plain layer with the merged weight ``W' = W + s B A``. :func:`merge_lora` computes ``W'`` for every
adapted layer; the ``hf`` rollout backend serves the merged weights after each adapter sync
(:mod:`verl_gigpo.verl_glue.cpu.hf_rollout`) and ``python -m verl_gigpo.export`` writes them (:mod:`verl_gigpo.export`).

Names. An adapter tensor is named after its layer: ``<layer>.lora_A[.<adapter>].weight`` and ``lora_B`` alike, with
or without peft's ``base_model.model.`` prefix (verl's checkpoints keep the adapter name ``default``, verl's weight
sync and its model merger drop it). ``<layer>.weight`` is the Hugging Face name of the weight it adapts.

Supported: what verl's FSDP engine builds (``FSDPEngine._build_lora_module``: rank, alpha, target modules, no bias
adapters). DoRA, per-layer ranks or alphas (``rank_pattern``/``alpha_pattern``), ``fan_in_fan_out`` layers, LoRA
biases and adapters on parameters (``target_parameters``) change the formula above and are refused by name.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["PEFT_PREFIX", "adapted_weight_name", "lora_scale", "merge_lora"]

#: prefix of every name in a peft model's state dict (``PeftModel`` -> ``LoraModel`` -> the Hugging Face model)
PEFT_PREFIX = "base_model.model."

#: adapter-config keys that, set (truthy), change ``W' = W + s B A`` or what the adapter's tensors are: the merge
#: here would be wrong
_UNSUPPORTED = ("use_dora", "fan_in_fan_out", "lora_bias", "rank_pattern", "alpha_pattern", "target_parameters")


def lora_scale(config: Mapping[str, Any]) -> float:
    """The factor ``s`` of ``W' = W + s B A`` for a peft LoRA config (a ``LoraConfig.to_dict()`` or an
    ``adapter_config.json``): ``lora_alpha / r``, or ``lora_alpha / sqrt(r)`` when ``use_rslora`` is true.

    Raises:
        ValueError: ``r`` not a whole number >= 1, or ``lora_alpha`` missing or 0 (verl's model merger writes 0 when a
            checkpoint lacks ``lora_train_meta.json``: the merge would silently drop the adapter).
        NotImplementedError: a setting that changes the formula (DoRA, per-layer ranks/alphas, fan_in_fan_out,
            LoRA biases, adapters on parameters: ``target_parameters``), named.
    """
    for key in _UNSUPPORTED:
        if config.get(key):
            raise NotImplementedError(
                f"LoRA config {key}={config[key]!r}: only plain LoRA on linear layers (W + s B A) is merged here"
            )
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise ValueError(f"LoRA config r={rank!r}: expected the adapter rank, a whole number >= 1")
    if not isinstance(alpha, int | float) or isinstance(alpha, bool) or alpha == 0:
        raise ValueError(
            f"LoRA config lora_alpha={alpha!r}: expected the non-zero alpha the adapter was trained with (verl records "
            "it in the checkpoint's lora_train_meta.json)"
        )
    return float(alpha) / (math.sqrt(rank) if config.get("use_rslora") else rank)


def adapted_weight_name(name: str) -> tuple[str, str] | None:
    """``(Hugging Face weight name, "A" | "B")`` of an adapter tensor's name, None for any other name.

    ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight`` and
    ``model.layers.0.self_attn.q_proj.lora_A.weight`` both give ``("model.layers.0.self_attn.q_proj.weight", "A")``.
    """
    if name.startswith(PEFT_PREFIX):
        name = name[len(PEFT_PREFIX) :]
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part in ("lora_A", "lora_B") and parts[-1] == "weight" and len(parts) - i in (2, 3):
            return ".".join([*parts[:i], "weight"]), part[-1]
    return None


@torch.no_grad()
def merge_lora(
    base: Mapping[str, torch.Tensor], adapter: Mapping[str, torch.Tensor], config: Mapping[str, Any]
) -> dict[str, torch.Tensor]:
    """Merged weights ``W' = W + s B A`` of every layer ``adapter`` adapts (module docstring).

    Args:
        base: Hugging Face weight name -> base weight ``W`` ``(out, in)`` (at least the adapted layers').
        adapter: adapter tensors, ``A`` ``(r, in)`` and ``B`` ``(out, r)`` per layer (names: module docstring).
        config: the adapter's peft LoRA config (:func:`lora_scale`).

    Returns:
        weight name -> ``W'`` ``(out, in)`` in ``W``'s dtype and device, for the adapted layers only. ``B A`` and the
        sum are computed in float32 (as peft's ``merge_and_unload`` does) at least, in float64 for float64 weights.

    Raises:
        ValueError: a tensor name that is not an adapter's, a layer with only one of A and B, a layer ``base`` lacks,
            or shapes that do not fit ``(out, in) = (out, r) @ (r, in)`` with ``r`` the config's rank.
    """
    scale = lora_scale(config)
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in adapter.items():
        parsed = adapted_weight_name(name)
        if parsed is None:
            raise ValueError(f"adapter tensor {name!r} is not a LoRA weight (<layer>.lora_A/lora_B[.<adapter>].weight)")
        pairs.setdefault(parsed[0], {})[parsed[1]] = tensor
    merged = {}
    for weight_name, pair in sorted(pairs.items()):
        if set(pair) != {"A", "B"}:
            raise ValueError(
                f"adapter of {weight_name}: has lora_{''.join(sorted(pair))} only, needs lora_A and lora_B"
            )
        if weight_name not in base:
            raise ValueError(f"adapter of {weight_name}: the model has no weight of that name")
        w, a, b = base[weight_name], pair["A"], pair["B"]
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != config["r"] or tuple(w.shape) != (b.shape[0], a.shape[1]):
            raise ValueError(
                f"adapter of {weight_name}: A {tuple(a.shape)}, B {tuple(b.shape)} do not fit W {tuple(w.shape)} at "
                f"rank {config['r']} (expected A (r, in), B (out, r), W (out, in))"
            )
        dtype = torch.float64 if w.dtype == torch.float64 else torch.float32
        delta = (b.to(w.device, dtype) @ a.to(w.device, dtype)) * scale  # (out, in)
        merged[weight_name] = (w.to(dtype) + delta).to(w.dtype)
    return merged
