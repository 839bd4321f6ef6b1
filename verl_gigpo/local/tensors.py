"""Left padding of token sequences for a causal LM, shared by the generation server and the actor update."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["left_pad"]


def left_pad(
    sequences: Sequence[Sequence[int]], pad_id: int, *, device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-pad B >= 1 token-id sequences (lengths ``L_b``, ``W = max L_b``) into one batch on ``device``.

    Returns ``(input_ids, attention_mask, position_ids)``, each (B, W) int64: ``input_ids[b, W - L_b:]`` is sequence b
    after ``pad_id``; the mask is 1 on tokens; positions are ``0 .. L_b - 1`` on tokens, 0 on padding.
    ValueError: no sequence.
    """
    if len(sequences) == 0:
        raise ValueError("left_pad needs at least one sequence")
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)  # (B, W)
    attention = torch.zeros((len(sequences), width), dtype=torch.long)  # (B, W)
    for i, seq in enumerate(sequences):
        input_ids[i, width - len(seq) :] = torch.tensor(seq)
        attention[i, width - len(seq) :] = 1
    if device is not None:
        input_ids, attention = input_ids.to(device), attention.to(device)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)  # (B, W)
    return input_ids, attention, positions
