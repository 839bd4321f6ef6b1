"""Micro-batches of rows of similar length, for forward passes over padded rows (the CPU platform's split).

verl pads every row of a micro-batch to the longest one when ``use_remove_padding=false`` (the CPU platform's
setting: packing with sdpa is not used there). Its dynamic split (``use_dynamic_bsz``) balances the total tokens of
the micro-batches, so each mixes short and long rows and pays for the longest; its fixed split takes rows in batch
order, which is shuffled. Sorting by length first makes the padded size of a micro-batch close to its real size:
on the gridnav learning task (prompts of 18-82 tokens, mean 29) the actor's forward and backward passes do about
half the work.

Notation: a row's length ``l_i`` (prompt + response tokens); a micro-batch ``B`` costs ``|B| * max_{i in B} l_i``
padded tokens (what its forward pass computes); ``T`` is the budget of padded tokens per micro-batch.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["padded_tokens", "sorted_partition"]


def padded_tokens(lengths: Sequence[int], part: Sequence[int]) -> int:
    """Padded size of one micro-batch: ``|B| * max_{i in B} l_i`` (0 for an empty one)."""
    return len(part) * max((lengths[i] for i in part), default=0)


def sorted_partition(lengths: Sequence[int], max_tokens: int, num_parts: int | None = None) -> list[list[int]]:
    """Split rows into micro-batches of rows of similar length, each within ``max_tokens`` padded tokens.

    Rows are taken in order of length (ties by index) and added to the current micro-batch while
    ``(|B| + 1) * l_i <= T``; a row longer than ``T`` gets a micro-batch of its own. With ``num_parts``, the
    micro-batch with the most padded tokens (among those with two rows or more) is split in half until there are
    exactly ``num_parts`` (data-parallel ranks must run the same number of micro-batches).

    Args:
        lengths: (N,) tokens of each row (> 0).
        max_tokens: T, padded tokens per micro-batch (> 0).
        num_parts: the number of micro-batches wanted; at least what the budget needs (None: that number).

    Returns:
        Micro-batches as lists of row indices (each ascending), shortest rows first; every row in exactly one.

    Raises:
        ValueError: no rows, a length or ``max_tokens`` < 1, ``num_parts`` below the budget's count or above the
            number of rows.
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
