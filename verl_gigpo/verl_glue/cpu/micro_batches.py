"""Micro-batches of rows of similar length, for forward passes over padded rows (the CPU platform's split).

A micro-batch ``B`` costs ``|B| * max_{i in B} l_i`` padded tokens; ``T`` is the budget per micro-batch. Why:
docs/verl-integration.md ("The shims").
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["padded_tokens", "sorted_partition"]


def padded_tokens(lengths: Sequence[int], part: Sequence[int]) -> int:
    """Padded size of one micro-batch: ``|B| * max_{i in B} l_i`` (0 for an empty one)."""
    return len(part) * max((lengths[i] for i in part), default=0)


def sorted_partition(lengths: Sequence[int], max_tokens: int, num_parts: int | None = None) -> list[list[int]]:
    """Split rows into micro-batches of rows of similar length, each within ``max_tokens`` padded tokens.

    ``lengths``: (N,) tokens per row; rows are added in order of length while ``(|B| + 1) * l_i <= T``; with
    ``num_parts``, the largest micro-batch is halved until there are exactly that many. Returns lists of row indices
    (each ascending), shortest rows first. ValueError on empty or non-positive input or an impossible ``num_parts``.
    """
    n = len(lengths)
    if n == 0:
        raise ValueError("no rows to split into micro-batches")
    if max_tokens < 1 or min(lengths) < 1:
        raise ValueError(f"max_tokens ({max_tokens}) and every row length (min {min(lengths)}) must be >= 1")
    order = sorted(range(n), key=lambda i: (lengths[i], i))
    parts: list[list[int]] = [[]]
    for i in order:
        if parts[-1] and (len(parts[-1]) + 1) * lengths[i] > max_tokens:
            parts.append([])
        parts[-1].append(i)
    if num_parts is not None:
        if not len(parts) <= num_parts <= n:
            raise ValueError(
                f"cannot split {n} rows into {num_parts} micro-batches of at most {max_tokens} padded tokens "
                f"(the budget needs {len(parts)}, and each micro-batch needs a row)"
            )
        while len(parts) < num_parts:
            k = max((j for j in range(len(parts)) if len(parts[j]) > 1), key=lambda j: padded_tokens(lengths, parts[j]))
            half = len(parts[k]) // 2
            parts[k : k + 1] = [parts[k][:half], parts[k][half:]]
    return [sorted(part) for part in parts]
