"""Batching token sequences for a causal LM: the one left-padding helper of the local engine.

Both the generation server (:mod:`verl_gigpo.local.server`, prompts before decoding) and the actor update
(:mod:`verl_gigpo.local.update`, prompt + response before scoring) batch sequences of different lengths the same
way: left padding, so every sequence ends in the last column and the newest positions line up.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["left_pad"]


def left_pad(
    sequences: Sequence[Sequence[int]], pad_id: int, *, device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-pad B token-id sequences into one batch.

    Args:
        sequences: B >= 1 sequences of token ids, lengths ``L_b``; ``W = max L_b``.
        pad_id: the id written left of each shorter sequence (masked out, so any valid id works).
        device: where the returned tensors live (default: CPU).

    Returns:
        ``(input_ids, attention_mask, position_ids)``, each ``(B, W)`` int64: ``input_ids[b, W - L_b:]`` is
        sequence b and ``pad_id`` before it; ``attention_mask`` is 1 on the tokens and 0 on the padding;
        ``position_ids`` is ``0 .. L_b - 1`` on the tokens and 0 on the padding.

    Raises:
        ValueError: ``sequences`` is empty.
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
