"""Exact Dice verification of candidate pairs and connected components, shared by the prefix-filter and LSH paths.

Private: the public entry is :func:`verl_gigpo.advantage.anchors.similarity_groups` (docs/estimators.md, "How
``dice_components`` is computed", step 4).
"""

from __future__ import annotations

import numpy as np

__all__ = ["BITSET_WORDS", "Verifier", "connected_components", "fit_sizes", "merge", "pairs_in_runs", "sorted_unique"]

BITSET_WORDS = 2**23
"""Verification uses shingle bitsets (vectorised popcounts) while distinct texts x 64-bit words <= this (64 MB)."""


def fit_sizes(a: np.ndarray, b: np.ndarray, size: np.ndarray, jaccard_t: float) -> tuple[np.ndarray, np.ndarray]:
    """The pairs whose sizes allow Dice >= t: ``|small| / |large| >= t / (2 - t)``."""
    small, large = np.minimum(size[a], size[b]), np.maximum(size[a], size[b])
    fits = small >= jaccard_t * large - 1e-9
    return a[fits], b[fits]


class Verifier:
    """Exact Dice verification of candidate pairs: bitset popcounts for a small vocabulary, else bounds then sets.

    ``tokens[start[d] : start[d] + size[d]]`` are doc d's distinct token ids.
    """

    def __init__(self, tokens: np.ndarray, start: np.ndarray, size: np.ndarray, threshold: float) -> None:
        self.tokens, self.start, self.size, self.threshold = tokens, start, size, threshold
        num_docs = size.shape[0]
        doc_of = np.repeat(np.arange(num_docs), size)  # (S,)
        words = (int(tokens.max(initial=0)) >> 6) + 1
        self.bits = self.counts = None
        if num_docs * words <= BITSET_WORDS:
            bits = np.zeros((num_docs, words), dtype=np.uint64)  # (D, W) shingle-set bitsets
            shift = np.left_shift(np.uint64(1), (tokens & 63).astype(np.uint64))
            np.bitwise_or.at(bits, (doc_of, tokens >> 6), shift)
            self.bits = bits
        else:  # tokens split into 128 buckets: |A & B| <= sum_k min(|A_k|, |B_k|)
            counts = np.bincount(doc_of * 128 + (tokens & 127), minlength=num_docs * 128)
            self.counts = counts.reshape(num_docs, 128).astype(np.uint16)
            self.sets: dict[int, frozenset[int]] = {}

    def edges(self, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The candidate pairs ``(a, b)`` with Dice >= threshold (pairs already joined in this call may be left out)."""
        size, threshold = self.size, self.threshold
        if self.bits is not None:
            rows = max(1, 2**17 // self.bits.shape[1])  # pairs per chunk: temporaries of at most 1 MB
            inter = np.concatenate(
                [
                    np.bitwise_count(self.bits[a[i : i + rows]] & self.bits[b[i : i + rows]]).sum(
                        axis=1, dtype=np.int64
                    )
                    for i in range(0, a.shape[0], rows)
                ]
                or [np.zeros(0, dtype=np.int64)]
            )
            ok = 2.0 * inter / (size[a] + size[b]) >= threshold
            return a[ok], b[ok]
        # Large vocabulary: the exact upper bound first; it removes most unrelated candidates (bound ~0.7) cheaply.
        bound = np.concatenate(
            [
                np.minimum(self.counts[a[i : i + 65536]], self.counts[b[i : i + 65536]]).sum(axis=1, dtype=np.int64)
                for i in range(0, a.shape[0], 65536)
            ]
            or [np.zeros(0, dtype=np.int64)]
        )
        possible = 2.0 * bound / (size[a] + size[b]) >= threshold
        a, b = a[possible], b[possible]
        parent: dict[int, int] = {}

        def find(x: int) -> int:
            while parent.get(x, x) != x:
                parent[x] = parent.get(parent[x], parent[x])
                x = parent[x]
            return x

        sets, tokens = self.sets, self.tokens
        starts, sizes = self.start, self.size
        keep = []
        for x, y in zip(a.tolist(), b.tolist(), strict=True):
            rx, ry = find(x), find(y)
            if rx == ry:
                continue  # already connected: this edge cannot change the partition
            for d in (x, y):
                if d not in sets:
                    sets[d] = frozenset(tokens[starts[d] : starts[d] + sizes[d]].tolist())
            if 2.0 * len(sets[x] & sets[y]) / (int(sizes[x]) + int(sizes[y])) >= threshold:
                parent[max(rx, ry)] = min(rx, ry)
                keep.append((x, y))
        edges = np.array(keep, dtype=np.int64).reshape(-1, 2)
        return edges[:, 0], edges[:, 1]


def connected_components(num_nodes: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Component id (the smallest member) of each of ``num_nodes`` nodes under undirected edges ``a - b``."""
    label = np.arange(num_nodes, dtype=np.int64)
    while a.size:
        low = np.minimum(label[a], label[b])
        np.minimum.at(label, a, low)
        np.minimum.at(label, b, low)
        label = label[label]  # pointer jumping: labels are always members with smaller or equal ids
        while True:
            jumped = label[label]
            if np.array_equal(jumped, label):
                break
            label = jumped
        if np.array_equal(label[a], label[b]):
            break
    return label


def merge(label: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Component labels after adding edges ``a - b`` to the components ``label`` (each node's smallest member)."""
    la, lb = label[a], label[b]
    apart = la != lb
    if not apart.any():
        return label
    return connected_components(label.shape[0], la[apart], lb[apart])[label]


def pairs_in_runs(keys: np.ndarray, members: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All distinct pairs ``(a, b)``, ``a < b``, of ``members`` that share a key; ``keys`` must be sorted."""
    m = keys.shape[0]
    if m < 2:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    run_start = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    run_end = np.r_[run_start[1:], m]
    partners = np.repeat(run_end, run_end - run_start) - np.arange(m) - 1  # later members of the same run
    left = np.repeat(np.arange(m), partners)
    right = left + 1 + np.arange(left.shape[0]) - np.repeat(np.cumsum(partners) - partners, partners)
    a, b = members[left].astype(np.int64), members[right].astype(np.int64)
    a, b = np.minimum(a, b), np.maximum(a, b)
    pair = np.sort((a << 32) | b)
    pair = pair[np.r_[True, pair[1:] != pair[:-1]]] if pair.size else pair
    pair = pair[(pair >> 32) != (pair & 0xFFFFFFFF)]  # a doc paired with itself is no pair
    return pair >> 32, pair & 0xFFFFFFFF


def sorted_unique(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(x, return_inverse=True)`` by sorting (numpy's hash-based unique is slow on large arrays)."""
    order = np.argsort(x, kind="stable")
    xs = x[order]
    first = np.r_[True, xs[1:] != xs[:-1]]
    inverse = np.empty(x.shape[0], dtype=np.int64)
    inverse[order] = np.cumsum(first) - 1
    return xs[first], inverse
