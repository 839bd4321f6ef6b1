"""Anchor-state grouping: exact keys, and order-independent similarity grouping of free-text observations.

GiGPO compares actions taken from the same environment state (an *anchor state*) inside one episode group.
With exact keys that is plain equality of the anchor key. Free-text observations that differ only in a few
words (a counter, an object number) can instead be grouped by similarity; this module defines that similarity
precisely and groups by it in a way that does not depend on the order of the input.

Similarity measure (:func:`shingle_similarity`):
    Each text is encoded as UTF-8 and cut into its set of overlapping 5-byte shingles (for ASCII text: the set
    of character 5-grams; a text shorter than 5 bytes has one shingle, the whole text). The similarity of two
    texts with shingle sets A and B is the Sorensen-Dice coefficient ``2 |A & B| / (|A| + |B|)``, in [0, 1].
    For a ~300-character observation, changing one character ("apple 1" -> "apple 2") changes about 5 of ~300
    shingles (similarity ~0.98), one 6-letter word about 10 (~0.97), two words ~0.93, three words ~0.90.
    Unrelated observations built from the same template and vocabulary (ALFWorld-like) score around 0.5.

Grouping (:func:`similarity_groups`):
    Two texts are linked when they are identical or their similarity is >= threshold; the groups are the
    connected components of that graph. Components are transitive closures, so the partition is a function of
    the multiset of texts only: permuting the input permutes the labels of the same partition. Labels are
    canonical: component ids are numbered 0, 1, ... in the sorted order of each component's smallest text.
    ``threshold == 1.0`` means exact string equality (not "equal shingle sets").

How it is computed, and how it scales:
    1. Exact duplicates are collapsed (hash factorisation, O(n)); the rest works on the D distinct texts and
       their S shingles (O(S log S) to build).
    2. Candidate pairs, exact: prefix filtering (as in all-pairs set-similarity joins). Shingles are ordered
       globally by (document frequency, value) and each text indexes only its ``|A| - ceil(t' |A|) + 1``
       rarest shingles, with ``t' = t / (2 - t)`` the Jaccard equivalent of Dice threshold t. Two texts with
       Dice >= t share at least ``ceil(t' |A|)`` shingles, hence at least one indexed shingle: this never misses
       a pair. It is cheap when texts contain rare shingles (free text), but on low-entropy text (a template
       and a small vocabulary, where every shingle is frequent) nearly all pairs become candidates.
    3. So when prefix filtering would give more than ``PREFIX_PAIR_BUDGET + 50 D`` candidate pairs (counted
       before they are built), candidates come from MinHash-LSH instead: 256 fixed hash functions of the
       shingle bytes, banded into b bands of r rows (:func:`lsh_bands`; r = 8, b = 32 at t = 0.9); texts whose
       r rows of a band all agree share a bucket. This is deterministic (fixed hash functions, no random state)
       and still order-independent, but it can miss a pair: with probability ``(1 - J^r)^b`` for a pair of
       Jaccard similarity J (independent hash functions assumed), at t = 0.9 about 7.7e-4 for a pair exactly at
       the threshold, 3e-6 at Dice 0.93, 5e-9 at 0.95. A missed pair inside a cluster of near-duplicates is
       usually still connected through other members.
       Dense clusters (thousands of texts that share most of their shingles, e.g. ``"... step {i}"``) put
       thousands of texts in one bucket, and all pairs of a bucket would be O(n^2) memory and time. So a bucket
       of more than :data:`LSH_BUCKET_MAX` texts is split by r more rows of fresh hash functions, up to
       :data:`LSH_SPLIT_DEPTH` times (an LSH-forest-style longer key, only where the short key does not
       discriminate), and one still larger after that links its texts in sorted text order. Inside such a
       bucket a pair must agree on more rows, so its miss probability is higher than the figure above; a bucket
       whose texts are already in one component is skipped. Bands are processed one at a time, each giving at
       most ``D * LSH_BUCKET_MAX / 2`` pairs: memory is linear in the input whatever it is.
       ``similarity_groups(..., candidates="exact")`` forces step 2 (no misses, but quadratic memory and time
       on such input).
    4. Every candidate passes a size filter and is verified exactly: popcounts of shingle bitsets when the
       vocabulary is small (at most :data:`BITSET_WORDS` words in all); otherwise an exact upper bound
       (per-bucket shingle counts) and then set intersections that skip already-connected pairs. LSH verifies a
       band's pairs with each bucket's first text before the others, so most pairs of a near-duplicate bucket
       are skipped as already connected.
    Measured (benchmarks/RESULTS.md, 2 shared CPU cores): 10,000 ALFWorld-like observations of ~300 characters
    (duplicates, near-duplicates, distinct ones from a 16-word object vocabulary) take ~1.1-1.6 s through the
    LSH path, with exactly the partition of the exact path (checked; the exact path needs 15-80 s and 8 GB
    there); 10,000 free-text observations (3,000-word vocabulary) stay on the exact path and take ~0.7-1.0 s;
    10,000 dense near-duplicates ``"You are in the middle of a room. step {i}"`` take ~0.5-0.8 s with a
    tracemalloc peak of ~34 MB (before the bucket splitting: 3,000 of them took 10 s and 1.6 GB, 10,000 did
    not fit in memory).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from verl_gigpo._ids import as_id_array, id_codes, pair_codes

__all__ = [
    "LSH_BINS",
    "LSH_BUCKET_MAX",
    "LSH_MISS",
    "LSH_SPLIT_DEPTH",
    "PREFIX_PAIR_BUDGET",
    "SHINGLE_BYTES",
    "anchor_group_ids",
    "check_similarity_threshold",
    "lsh_bands",
    "shingle_set",
    "shingle_similarity",
    "similarity_groups",
]

logger = logging.getLogger(__name__)

SHINGLE_BYTES = 5
"""Length of a shingle in bytes of the UTF-8 encoding (characters, for ASCII text)."""

PREFIX_PAIR_BUDGET = 1_000_000
"""Exact prefix-filter candidates allowed (plus 50 per distinct text) before switching to MinHash-LSH."""

LSH_BINS = 256
"""Largest number of MinHash functions (rows x bands) of the LSH fallback."""

BITSET_WORDS = 2**23
"""Verification uses shingle bitsets (vectorised popcounts) while distinct texts x 64-bit words <= this (64 MB)."""

LSH_MISS = 1e-3
"""Target probability that the LSH fallback misses a pair exactly at the threshold (independent bins assumed)."""

LSH_BUCKET_MAX = 64
"""Largest LSH bucket whose pairs are all candidates; larger buckets are split with more MinHash rows."""

LSH_SPLIT_DEPTH = 6
"""Most times an oversized LSH bucket is split (r more rows each time) before its docs are chained in text order."""


def shingle_set(text: str) -> frozenset[bytes]:
    """The shingle set of ``text``: all overlapping 5-byte substrings of its UTF-8 encoding, or the whole
    encoding when it is shorter than 5 bytes (so the set is never empty)."""
    if not isinstance(text, str):
        raise ValueError(f"shingle_set needs a str, got {type(text).__name__}: {text!r}")
    data = text.encode("utf-8")
    if len(data) < SHINGLE_BYTES:
        return frozenset([data])
    return frozenset(data[i : i + SHINGLE_BYTES] for i in range(len(data) - SHINGLE_BYTES + 1))


def shingle_similarity(a: str, b: str) -> float:
    """Sorensen-Dice similarity of the shingle sets: ``2 |A & B| / (|A| + |B|)`` with ``A = shingle_set(a)``.

    1.0 for identical texts (and for texts with equal shingle sets), 0.0 for texts sharing no shingle.
    This is the reference definition of the similarity used by :func:`similarity_groups`.
    """
    sa, sb = shingle_set(a), shingle_set(b)
    return 2.0 * len(sa & sb) / (len(sa) + len(sb))


def similarity_groups(texts: Sequence[str] | np.ndarray, threshold: float, *, candidates: str = "auto") -> np.ndarray:
    """Group near-identical texts: connected components of "identical or shingle similarity >= threshold".

    See the module docstring for the similarity measure, why the partition is order-independent, how candidate
    pairs are found (exactly, or by MinHash-LSH with a stated miss probability on low-entropy text), and how it
    scales.

    Args:
        texts: ``(n,)`` sequence or array of str.
        threshold: in (0, 1]; 1.0 = exact string equality.
        candidates: how candidate pairs are found: ``"auto"`` (exact prefix filtering while it stays within
            :data:`PREFIX_PAIR_BUDGET` + 50 candidates per distinct text, else MinHash-LSH), ``"exact"`` (always
            prefix filtering: never misses a pair, but quadratic on low-entropy text) or ``"lsh"``.

    Returns:
        ``(n,)`` int64 group ids in ``[0, G)``; equal ids = same group. Ids are canonical: groups are numbered
        in the sorted order of their smallest text, so they do not depend on the input order.

    Raises:
        ValueError: a threshold outside (0, 1], or a non-str entry (naming its index and type).
    """
    check_similarity_threshold(threshold)
    if candidates not in ("auto", "exact", "lsh"):
        raise ValueError(f"candidates={candidates!r} is not valid; use 'auto', 'exact' or 'lsh'")
    arr = _as_text_array(texts, "texts")
    n = arr.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    doc, uniques = pd.factorize(arr)  # (n,), (D,) exact duplicates collapse here
    doc = doc.astype(np.int64, copy=False)
    budget = {"auto": None, "exact": np.iinfo(np.int64).max, "lsh": -1}[candidates]
    component = _components(uniques, np.zeros(len(uniques), dtype=np.int64), threshold, pair_budget=budget)  # (D,)
    # Canonical labels: number components by the sorted rank of their smallest text.
    text_rank = np.empty(len(uniques), dtype=np.int64)
    text_rank[np.argsort(uniques)] = np.arange(len(uniques))  # Python str order (code points); texts distinct
    smallest = np.full(int(component.max()) + 1, len(uniques), dtype=np.int64)
    np.minimum.at(smallest, component, text_rank)
    label = np.empty_like(smallest)
    label[np.argsort(smallest)] = np.arange(len(smallest))
    return label[component][doc]


def anchor_group_ids(
    anchor_keys: Sequence[Any] | np.ndarray,
    group_ids: Sequence[Any] | np.ndarray,
    similarity_threshold: float | None = None,
    *,
    row_mask: np.ndarray | None = None,
) -> np.ndarray:
    """Anchor-group id of each row: rows share an id iff they are in the same episode group and their anchor
    keys match.

    "Match" is exact equality of the keys when ``similarity_threshold`` is None or 1.0 (any hashable keys), and
    otherwise the similarity grouping of :func:`similarity_groups` (str keys only), applied *within each episode
    group*: texts of different episode groups are never compared, and a chain of similar texts is never built
    through another group. (GiGPO only compares steps inside one episode group, so that is all that matters.)

    The result can be passed as ``anchor_keys`` to :func:`verl_gigpo.advantage.compute_gigpo_advantage`.

    Args:
        anchor_keys: ``(N,)`` hashables (exact mode) or str (similarity mode).
        group_ids: ``(N,)`` hashables, the episode group of each row.
        similarity_threshold: None / 1.0 for exact keys, else a threshold in (0, 1).
        row_mask: optional ``(N,)`` bool; rows with False (padding, failed episodes) are left out: not
            validated, never compared, id -1.

    Returns:
        ``(N,)`` int64 ids in ``[0, K)`` (-1 for masked rows). The partition does not depend on the row order; the
        id values are numbered by first appearance and carry no meaning.

    Raises:
        ValueError: length mismatch, missing (None/NaN) or unhashable keys/ids, a threshold outside (0, 1],
            non-str keys in similarity mode, or a row_mask that is not a bool (N,) array.
    """
    if similarity_threshold is not None:  # first, whatever the input: True is no threshold though True == 1.0
        similarity_threshold = check_similarity_threshold(similarity_threshold)
    groups = as_id_array(group_ids, "group_ids")
    keys = as_id_array(anchor_keys, "anchor_keys", groups.shape[0], other="group_ids")
    if row_mask is not None:
        mask = np.asarray(row_mask)
        if mask.dtype != np.bool_ or mask.shape != keys.shape:
            raise ValueError(
                f"row_mask must be a bool array of shape {keys.shape}, got dtype {mask.dtype} and shape {mask.shape}"
            )
        out = np.full(keys.shape[0], -1, dtype=np.int64)
        out[mask] = anchor_group_ids(keys[mask], groups[mask], similarity_threshold)
        return out
    if keys.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    g = id_codes(groups, "group_ids")
    if similarity_threshold is None or similarity_threshold == 1.0:
        return pair_codes(g, id_codes(keys, "anchor_keys"))[0]
    texts = _as_text_array(keys, "anchor_keys")
    pair, num_pairs = pair_codes(g, id_codes(texts, "anchor_keys"))  # (N,) distinct (group, text)
    first = np.empty(num_pairs, dtype=np.int64)
    first[pair] = np.arange(pair.shape[0])
    component = _components(texts[first], g[first], similarity_threshold)  # (P,)
    return id_codes(component[pair], "anchor groups")


# ----------------------------------------------------------------------------------------------------------------
# helpers


def _components(
    docs: np.ndarray, blocks: np.ndarray, threshold: float, *, pair_budget: int | None = None
) -> np.ndarray:
    """Connected components over distinct texts ``docs`` (D,) of "same block and similarity >= threshold".

    ``pair_budget`` (default :data:`PREFIX_PAIR_BUDGET` + 50 D) caps the exact prefix-filter candidates before
    switching to MinHash-LSH. Returns ``(D,)`` int64 component ids (arbitrary numbering).
    """
    num_docs = docs.shape[0]
    if threshold >= 1.0 or num_docs < 2:
        return np.arange(num_docs, dtype=np.int64)
    budget = PREFIX_PAIR_BUDGET + 50 * num_docs if pair_budget is None else pair_budget
    doc, code = _shingles(docs)  # (S,), (S,) one entry per distinct (doc, shingle), sorted by doc
    size = np.bincount(doc, minlength=num_docs)  # (D,) |A|
    codes, code_id = _sorted_unique(code)  # (V,) distinct shingle codes, (S,) dense shingle ids
    # shingles of different blocks are different tokens:
    token = _sorted_unique((blocks[doc] << 32) | code_id)[1] if blocks.max(initial=0) > 0 else code_id
    count = np.bincount(token)  # document frequency of each token
    rank = np.empty(count.shape[0], dtype=np.int64)  # global order: rarest first, ties by token id
    rank[np.lexsort((np.arange(count.shape[0]), count))] = np.arange(count.shape[0])

    # Prefix filter: each doc indexes its |A| - ceil(t'|A|) + 1 rarest shingles.
    doc_rank = np.sort((doc << 32) | rank[token])  # (S,) grouped by doc (already sorted), rarest first
    rank_s = doc_rank & 0xFFFFFFFF
    start = np.cumsum(size) - size  # (D,)
    pos = np.arange(doc.shape[0]) - start[doc]  # position of each shingle in its doc's order
    jaccard_t = threshold / (2.0 - threshold)
    need = np.ceil(jaccard_t * size - 1e-9).astype(np.int64)  # (D,) shingles any partner must share
    prefix = np.clip(size - need + 1, 1, size)  # (D,)
    keep = pos < prefix[doc]
    posting = np.sort((rank_s[keep] << 32) | doc[keep])  # posting lists: by token, then doc
    run_len = np.diff(np.r_[np.flatnonzero(np.r_[True, np.diff(posting >> 32) != 0]), posting.shape[0]])
    num_prefix_pairs = int((run_len * (run_len - 1) // 2).sum())
    del doc_rank, pos, keep
    verifier = _Verifier(rank_s, start, size, threshold)
    if num_prefix_pairs > budget:  # low-entropy text: frequent shingles everywhere, prefix filtering would compare
        del posting  # almost all pairs
        block_of_doc = np.zeros(num_docs, dtype=np.int64)
        block_of_doc[doc] = blocks[doc]
        return _lsh_components(docs, code_id, codes, start, size, block_of_doc, verifier, threshold)
    a, b = _pairs_in_runs(posting >> 32, posting & 0xFFFFFFFF)
    a, b = _fit_sizes(a, b, size, jaccard_t)
    logger.debug("similarity grouping: %d texts, %d candidate pairs by prefix filter (exact)", num_docs, a.shape[0])
    return _connected_components(num_docs, *verifier.edges(a, b))


def _fit_sizes(a: np.ndarray, b: np.ndarray, size: np.ndarray, jaccard_t: float) -> tuple[np.ndarray, np.ndarray]:
    """The pairs whose sizes allow Dice >= t: ``|small| / |large| >= t / (2 - t)``."""
    small, large = np.minimum(size[a], size[b]), np.maximum(size[a], size[b])
    fits = small >= jaccard_t * large - 1e-9
    return a[fits], b[fits]


class _Verifier:
    """Exact Dice verification of candidate pairs over distinct-token lists.

    ``tokens[start[d] : start[d] + size[d]]`` are doc d's distinct token ids. With a small token vocabulary
    (bitsets of all docs within :data:`BITSET_WORDS`) the intersections are popcounts of ANDed bitsets,
    vectorised. Otherwise candidates first pass an exact upper bound on the intersection (per-bucket counts),
    then a loop intersects Python sets, skipping pairs already joined through pairs accepted in the same call.
    Memory: the bitsets (at most :data:`BITSET_WORDS` words) or ``(D, 128)`` counts, plus cached sets of the
    docs met so far (at most the input).
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
        """The candidate pairs ``(a, b)`` whose exact Dice similarity is >= threshold (the set-intersection path
        may leave out a pair whose two docs are already joined through pairs it accepted in this call)."""
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


def _connected_components(num_nodes: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
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


def _merge(label: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Component labels after adding edges ``a - b`` to the components ``label`` (each node's smallest member)."""
    la, lb = label[a], label[b]
    apart = la != lb
    if not apart.any():
        return label
    return _connected_components(label.shape[0], la[apart], lb[apart])[label]


def _pairs_in_runs(keys: np.ndarray, members: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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


def lsh_bands(threshold: float) -> tuple[int, int]:
    """``(rows r, bands b)`` of the MinHash-LSH fallback for a Dice ``threshold``: the largest r whose
    ``b = LSH_BINS // r`` bands miss a pair at the threshold with probability ``(1 - J^r)^b <= LSH_MISS``
    (J = t / (2 - t), the Jaccard equivalent; independent bins assumed)."""
    jaccard_t = threshold / (2.0 - threshold)
    for r in range(LSH_BINS, 0, -1):
        if (1.0 - jaccard_t**r) ** (LSH_BINS // r) <= LSH_MISS:
            return r, LSH_BINS // r
    return 1, LSH_BINS


def _lsh_components(
    docs: np.ndarray,
    code_id: np.ndarray,
    codes: np.ndarray,
    start: np.ndarray,
    size: np.ndarray,
    block: np.ndarray,
    verifier: _Verifier,
    threshold: float,
) -> np.ndarray:
    """Connected components from MinHash-LSH candidates, one band at a time, in memory linear in the input.

    ``code_id[start[d] : start[d] + size[d]]`` index doc d's distinct shingle codes in ``codes``; ``block`` (D,)
    is each doc's block. Signature row k of a doc is ``min h_k`` over its shingles, for fixed hash functions
    ``h_k`` (splitmix64 of the shingle code mixed with a seed: functions of the shingle bytes only); two docs
    agree on a row with probability J (their Jaccard similarity). A band is r rows (:func:`lsh_bands`); docs of
    one block whose band rows all agree share a bucket. Buckets of at most :data:`LSH_BUCKET_MAX` docs give all
    their pairs as candidates. A larger bucket (low-entropy text, where the minima fall on shingles that every
    text shares) is split with r more rows of fresh hash functions, repeatedly (at most :data:`LSH_SPLIT_DEPTH`
    times); a bucket still too large after that gives the pairs of consecutive docs in text order. So a band
    gives at most ``D * LSH_BUCKET_MAX / 2`` pairs, whatever the input. Candidates are verified exactly and
    merged into the components band by band; pairs and whole buckets already inside one component are skipped.
    Returns ``(D,)`` int64 component ids.
    """
    num_docs = size.shape[0]
    r, b = lsh_bands(threshold)
    jaccard_t = threshold / (2.0 - threshold)
    code_hash = _mix64(codes.astype(np.uint64))  # (V,) one 64-bit hash per distinct shingle
    block_hash = _mix64(block.astype(np.uint64) * np.uint64(0x2545F4914F6CDD1D) + np.uint64(1))  # (D,)
    everyone = np.arange(num_docs, dtype=np.int64)
    label = everyone.copy()  # (D,) smallest member of each doc's component so far
    text_rank: list[np.ndarray] = []  # filled on first use: rank of each doc in sorted text order
    counts = {"pairs": 0, "split": 0, "chained": 0}

    def band_key(members: np.ndarray, key: np.ndarray, seeds: np.ndarray) -> np.ndarray:
        sig = _minhash(code_id, code_hash, start, size, members, seeds)  # (r, m)
        for row in sig:
            key = _mix64(key ^ row.astype(np.uint64))
        return key

    def bucket_pairs(members: np.ndarray, key: np.ndarray, band: int, depth: int, star: list, rest: list) -> None:
        """Append the candidate pairs of the buckets of ``members`` under ``key``: the pairs of each bucket's
        first member (or a chain) to ``star``, all pairs of small buckets to ``rest``."""
        order = np.argsort(key, kind="stable")
        members, key = members[order], key[order]
        run_start = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        run_len = np.diff(np.r_[run_start, members.shape[0]])
        small = (run_len >= 2) & (run_len <= LSH_BUCKET_MAX)
        in_small = np.repeat(small, run_len)
        if in_small.any():
            rest.append(_pairs_in_runs(key[in_small], members[in_small]))
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
                seeds = _mix64(np.uint64(1 << 40) + np.arange(r, dtype=np.uint64) + np.uint64((band * 64 + depth) * r))
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
        seeds = _mix64(np.arange(band * r + 1, (band + 1) * r + 1, dtype=np.uint64))
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
            a, b_ = _fit_sizes(a[apart], b_[apart], size, jaccard_t)
            counts["pairs"] += a.shape[0]
            label = _merge(label, *verifier.edges(a, b_))
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
    """MinHash signature rows ``(K, m)`` uint32 of docs ``members`` for the hash functions ``seeds`` (K,):
    row k of doc d is ``min over d's shingles x of h_k(x)``, with the multiply-add-shift hash
    ``h_k(x) = (code_hash[x] * a_k + c_k) mod 2^64 >> 32`` (``a_k`` odd, both from splitmix64 of ``seeds[k]``;
    ``code_hash`` is already a well-mixed 64-bit hash of the shingle bytes).

    Docs are processed in chunks of about 64k shingles so that a chunk's shingle ids stay in cache over the K
    rows; memory is O(m K + chunk).
    """
    m = members.shape[0]
    out = np.empty((seeds.shape[0], m), dtype=np.uint32)
    mult = _mix64(seeds) | np.uint64(1)  # (K,) odd multipliers
    add = _mix64(seeds ^ np.uint64(0x9E3779B97F4A7C15))  # (K,)
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


def _sorted_unique(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(x, return_inverse=True)`` by sorting (numpy's hash-based unique is slow on large arrays)."""
    order = np.argsort(x, kind="stable")
    xs = x[order]
    first = np.r_[True, xs[1:] != xs[:-1]]
    inverse = np.empty(x.shape[0], dtype=np.int64)
    inverse[order] = np.cumsum(first) - 1
    return xs[first], inverse


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on uint64 arrays (wrapping arithmetic): a fixed, well-mixed 64-bit hash."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _shingles(docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct (doc, shingle code) pairs of the texts ``docs``, sorted by doc then code.

    A shingle of bytes ``b0 .. b4`` has code ``b0 << 32 | b1 << 24 | ... | b4`` (< 2^40); a text of ``k < 5``
    bytes has the single code ``(k + 1) << 40 | bytes``, which no full shingle can take.
    """
    w = SHINGLE_BYTES
    encoded = [s.encode("utf-8") for s in docs.tolist()]
    lengths = np.fromiter((len(e) for e in encoded), dtype=np.int64, count=len(encoded))  # (D,)
    data = np.frombuffer(b"".join(encoded) + bytes(w), dtype=np.uint8).astype(np.int64)  # (B + w,) zero-padded
    num_bytes = data.shape[0] - w
    ends = np.cumsum(lengths)
    starts = ends - lengths
    code = data[:num_bytes] << (8 * (w - 1))  # (B,) the shingle starting at every byte (contiguous slices)
    for k in range(1, w):
        code |= data[k : num_bytes + k] << (8 * (w - 1 - k))
    full = np.ones(num_bytes, dtype=bool)  # a full shingle starts here: not in the last w - 1 bytes of a text
    for k in range(1, w):
        last = ends - k
        full[last[last >= starts]] = False
    doc = np.repeat(np.arange(len(encoded)), lengths)[full]
    code = code[full]
    short = np.flatnonzero(lengths < w)
    if short.size:
        short_code = (lengths[short] + 1) << (8 * w)
        for k in range(w - 1):  # the bytes of a short text; reading past its end gives 0 (masked anyway)
            byte = np.where(lengths[short] > k, data[starts[short] + k], 0)
            short_code |= byte << (8 * (w - 2 - k))
        doc = np.r_[doc, short]
        code = np.r_[code, short_code]
    key = np.sort((doc << 43) | code) if len(encoded) < 2**20 else None
    if key is None:  # very many texts: sort by (doc, code) with two keys instead of one packed key
        order = np.lexsort((code, doc))
        doc, code = doc[order], code[order]
        keep = np.r_[True, (doc[1:] != doc[:-1]) | (code[1:] != code[:-1])]
        return doc[keep], code[keep]
    key = key[np.r_[True, key[1:] != key[:-1]]]
    return key >> 43, key & ((1 << 43) - 1)


def check_similarity_threshold(threshold: Any) -> float:
    """Validate a similarity threshold; the one check behind ``GiGPOConfig.similarity_threshold``, the estimator's
    ``similarity_threshold`` option and the functions of this module.

    Valid: a number in (0, 1] (1.0 = exact string equality). Booleans, strings, None and NaN are not numbers.

    Returns:
        the threshold as a Python float.

    Raises:
        ValueError: naming the value given and what the valid values mean.
    """
    ok = isinstance(threshold, (int, float, np.integer, np.floating)) and not isinstance(threshold, (bool, np.bool_))
    if not ok or math.isnan(threshold) or not 0.0 < threshold <= 1.0:
        shown = threshold.item() if isinstance(threshold, np.generic) else threshold
        raise ValueError(
            f"similarity_threshold={shown!r} must be a number in (0, 1]: 1.0 = exact match, 0.9 = texts whose "
            "5-byte shingle sets have Dice similarity >= 0.9 (observations that differ in a few words)"
        )
    return float(threshold)


def _as_text_array(values: Any, name: str) -> np.ndarray:
    arr = as_id_array(values, name)
    if arr.dtype.kind == "U":
        return arr.astype(object)
    not_str = [i for i, v in enumerate(arr.tolist()) if not isinstance(v, str)]
    if not_str:
        i = not_str[0]
        raise ValueError(
            f"{name}[{i}] is a {type(arr[i]).__name__} ({arr[i]!r}); similarity grouping needs str for every "
            "entry (use exact keys, similarity_threshold=None, for non-text keys)"
        )
    return arr.astype(object, copy=False)
