"""LoRA adapters as verl trains them (peft's LoRA on linear layers), merged into full weights.

Notation (LoRA, arXiv 2106.09685; peft's ``LoraLayer``): a linear layer ``y = x W^T + b``, ``W`` (out, in), gets
``A`` (r, in) and ``B`` (out, r); in evaluation mode it computes ``y = x W^T + b + s (x A^T) B^T`` with
``s = alpha / r`` (``alpha / sqrt(r)`` with rsLoRA), which is the plain layer with ``W' = W + s B A``. Adapter
tensors are named ``<layer>.lora_A[.<adapter>].weight`` (and ``lora_B``), with or without peft's
``base_model.model.`` prefix. Supported: what verl's FSDP engine builds; settings that change the formula are refused
by name. Used by the ``hf`` rollout backend and ``python -m verl_gigpo.export`` (docs/export.md).
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
    """The factor ``s`` of ``W' = W + s B A``: ``lora_alpha / r``, or ``lora_alpha / sqrt(r)`` with ``use_rslora``.
    ValueError for a bad ``r`` or a missing/0 ``lora_alpha``; NotImplementedError for a setting that changes the
    formula (DoRA, per-layer ranks/alphas, fan_in_fan_out, LoRA biases, ``target_parameters``)."""
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
    """``(Hugging Face weight name, "A" | "B")`` of an adapter tensor's name, None for any other name:
    ``base_model.model.<layer>.lora_A.default.weight`` and ``<layer>.lora_A.weight`` give ``("<layer>.weight", "A")``.
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
    """Merged weights ``W' = W + s B A`` (``W`` (out, in), ``A`` (r, in), ``B`` (out, r)) of every layer ``adapter``
    adapts, in ``W``'s dtype, computed in float32 at least; ``base``: HF name -> ``W``; ``config``: peft's LoRA config.
    ValueError for a name that is not an adapter's, a layer with one of A and B, a layer ``base`` lacks, bad shapes.
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
