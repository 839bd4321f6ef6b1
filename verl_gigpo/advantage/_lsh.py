"""MinHash-LSH candidate pairs for the similarity grouping of low-entropy text (docs/estimators.md, "How
``dice_components`` is computed", step 3).

Private: the public entry is :func:`verl_gigpo.advantage.anchors.similarity_groups`.
"""

from __future__ import annotations

import logging

import numpy as np

from verl_gigpo.advantage._similarity_graph import Verifier, fit_sizes, merge, pairs_in_runs

__all__ = ["LSH_BINS", "LSH_BUCKET_MAX", "LSH_MISS", "LSH_SPLIT_DEPTH", "lsh_bands", "lsh_components", "mix64"]

logger = logging.getLogger(__name__)

LSH_BINS = 256
"""Largest number of MinHash functions (rows x bands) of the LSH fallback."""

LSH_MISS = 1e-3
"""Target probability that the LSH fallback misses a pair exactly at the threshold (independent bins assumed)."""

LSH_BUCKET_MAX = 64
"""Largest LSH bucket whose pairs are all candidates; larger buckets are split with more MinHash rows."""

LSH_SPLIT_DEPTH = 6
"""Most times an oversized LSH bucket is split (r more rows each time) before its docs are chained in text order."""


def lsh_bands(threshold: float) -> tuple[int, int]:
    """``(rows r, bands b = LSH_BINS // r)`` for Dice ``threshold``: the largest r with ``(1 - J^r)^b <= LSH_MISS``."""
    jaccard_t = threshold / (2.0 - threshold)
    for r in range(LSH_BINS, 0, -1):
        if (1.0 - jaccard_t**r) ** (LSH_BINS // r) <= LSH_MISS:
            return r, LSH_BINS // r
    return 1, LSH_BINS


def lsh_components(
    docs: np.ndarray,
    code_id: np.ndarray,
    codes: np.ndarray,
    start: np.ndarray,
    size: np.ndarray,
    block: np.ndarray,
    verifier: Verifier,
    threshold: float,
) -> np.ndarray:
    """Component ids (D,) int64 from MinHash-LSH candidates, one band at a time, in memory linear in the input.

    ``code_id[start[d] : start[d] + size[d]]`` index doc d's shingle codes in ``codes``; ``block`` (D,): its block.
    """
    num_docs = size.shape[0]
    r, b = lsh_bands(threshold)
    jaccard_t = threshold / (2.0 - threshold)
    code_hash = mix64(codes.astype(np.uint64))  # (V,) one 64-bit hash per distinct shingle
    block_hash = mix64(block.astype(np.uint64) * np.uint64(0x2545F4914F6CDD1D) + np.uint64(1))  # (D,)
    everyone = np.arange(num_docs, dtype=np.int64)
    label = everyone.copy()  # (D,) smallest member of each doc's component so far
    text_rank: list[np.ndarray] = []  # filled on first use: rank of each doc in sorted text order
    counts = {"pairs": 0, "split": 0, "chained": 0}

    def band_key(members: np.ndarray, key: np.ndarray, seeds: np.ndarray) -> np.ndarray:
        sig = _minhash(code_id, code_hash, start, size, members, seeds)  # (r, m)
        for row in sig:
            key = mix64(key ^ row.astype(np.uint64))
        return key

    def bucket_pairs(members: np.ndarray, key: np.ndarray, band: int, depth: int, star: list, rest: list) -> None:
        """Append the candidate pairs of the buckets of ``members`` under ``key`` to ``star`` and ``rest``."""
        order = np.argsort(key, kind="stable")
        members, key = members[order], key[order]
        run_start = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        run_len = np.diff(np.r_[run_start, members.shape[0]])
        small = (run_len >= 2) & (run_len <= LSH_BUCKET_MAX)
        in_small = np.repeat(small, run_len)
        if in_small.any():
            rest.append(pairs_in_runs(key[in_small], members[in_small]))
            first = np.repeat(members[run_start[small]], run_len[small])  # (m_small,) first member of the bucket
            other = members[in_small]
            star.append((first[first != other], other[first != other]))
        large = run_len > LSH_BUCKET_MAX
        for s, n in zip(run_start[large].tolist(), run_len[large].tolist(), strict=True):
            group = members[s : s + n]
            if np.all(label[group] == label[group[0]]):
                continue  # already one component: no pair of this bucket can change the partition
            if depth < LSH_SPLIT_DEPTH:
                counts["split"] += n
                seeds = mix64(np.uint64(1 << 40) + np.arange(r, dtype=np.uint64) + np.uint64((band * 64 + depth) * r))
                bucket_pairs(group, band_key(group, key[s : s + n], seeds), band, depth + 1, star, rest)
                continue
            if not text_rank:
                rank = np.empty(num_docs, dtype=np.int64)
                rank[np.argsort(docs, kind="stable")] = everyone
                text_rank.append(rank)
            chain = group[np.argsort(text_rank[0][group])]
            counts["chained"] += n
            star.append((np.minimum(chain[:-1], chain[1:]), np.maximum(chain[:-1], chain[1:])))

    for band in range(b):
        seeds = mix64(np.arange(band * r + 1, (band + 1) * r + 1, dtype=np.uint64))
        star: list[tuple[np.ndarray, np.ndarray]] = []
        rest: list[tuple[np.ndarray, np.ndarray]] = []
        bucket_pairs(everyone, band_key(everyone, block_hash, seeds), band, 0, star, rest)
        # The star pairs first: in a bucket of near-duplicates they join it at once, and most other pairs of the
        # bucket are then skipped as already connected. The partition is that of all the band's pairs either way.
        for pairs in (star, rest):
            if not pairs:
                continue
            a, b_ = (np.concatenate(x) for x in zip(*pairs, strict=True))
            apart = label[a] != label[b_]
            a, b_ = fit_sizes(a[apart], b_[apart], size, jaccard_t)
            counts["pairs"] += a.shape[0]
            label = merge(label, *verifier.edges(a, b_))
    logger.debug(
        "similarity grouping: %d texts, %d candidate pairs by MinHash-LSH (%d bucket members split, %d chained)",
        num_docs,
        counts["pairs"],
        counts["split"],
        counts["chained"],
    )
    return label


def _minhash(
    code_id: np.ndarray,
    code_hash: np.ndarray,
    start: np.ndarray,
    size: np.ndarray,
    members: np.ndarray,
    seeds: np.ndarray,
) -> np.ndarray:
    """MinHash rows (K, m) uint32 of docs ``members``: ``min_x (code_hash[x] * a_k + c_k) mod 2^64 >> 32`` per seed."""
    m = members.shape[0]
    out = np.empty((seeds.shape[0], m), dtype=np.uint32)
    mult = mix64(seeds) | np.uint64(1)  # (K,) odd multipliers
    add = mix64(seeds ^ np.uint64(0x9E3779B97F4A7C15))  # (K,)
    lengths = size[members]  # (m,) all >= 1
    ends = np.cumsum(lengths)
    table = None
    # A table of every distinct shingle's hash per row, when that is less work and a row fits in cache (1 MB):
    if code_hash.shape[0] <= min(int(ends[-1]), 2**18):
        table = np.empty((seeds.shape[0], code_hash.shape[0]), dtype=np.uint32)  # (K, V)
        for k in range(seeds.shape[0]):
            table[k] = ((code_hash * mult[k] + add[k]) >> np.uint64(32)).astype(np.uint32)
    lo = 0
    while lo < m:
        hi = max(int(np.searchsorted(ends, ends[lo] - lengths[lo] + 65536, side="right")), lo + 1)
        chunk_len = lengths[lo:hi]
        offsets = np.cumsum(chunk_len) - chunk_len  # (c,)
        entries = np.repeat(start[members[lo:hi]] - offsets, chunk_len) + np.arange(int(chunk_len.sum()))  # (e,)
        tok = code_id[entries]  # (e,) shingle ids of the chunk's docs, doc after doc
        buf = np.empty(tok.shape[0], dtype=np.uint32)
        h = code_hash[tok] if table is None else None
        for k in range(seeds.shape[0]):
            if table is None:
                buf = ((h * mult[k] + add[k]) >> np.uint64(32)).astype(np.uint32)
            else:
                np.take(table[k], tok, out=buf)
            out[k, lo:hi] = np.minimum.reduceat(buf, offsets)  # docs are contiguous and non-empty
        lo = hi
    return out


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on uint64 arrays (wrapping arithmetic): a fixed, well-mixed 64-bit hash."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))
