"""Anchor-state grouping: exact keys, and order-independent similarity grouping of free-text observations.

Rows share an anchor group when they are in one episode group and their keys match: exactly, or (free text) by
5-byte shingle Dice similarity >= t, as connected components (:func:`similarity_groups`). The reference's
difflib first-fit grouping is an option (:func:`first_fit_anchor_ids`). The measure, the algorithm (prefix filter,
MinHash-LSH for low-entropy text) and its miss probability: docs/estimators.md, "Similarity grouping".
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from difflib import SequenceMatcher
from typing import Any

import numpy as np
import pandas as pd

from verl_gigpo.advantage._ids import as_id_array, id_codes, pair_codes
from verl_gigpo.advantage._inputs import as_row_mask
from verl_gigpo.advantage._lsh import LSH_BINS, LSH_BUCKET_MAX, LSH_MISS, LSH_SPLIT_DEPTH, lsh_bands, lsh_components
from verl_gigpo.advantage._similarity_graph import (
    Verifier,
    connected_components,
    fit_sizes,
    pairs_in_runs,
    sorted_unique,
)
from verl_gigpo.config.rules import KeyValueError

__all__ = [
    "SIMILARITY_GROUPINGS",
    "LSH_BINS",
    "LSH_BUCKET_MAX",
    "LSH_MISS",
    "LSH_SPLIT_DEPTH",
    "PREFIX_PAIR_BUDGET",
    "SHINGLE_BYTES",
    "anchor_group_ids",
    "check_similarity_grouping",
    "check_similarity_threshold",
    "difflib_ratio",
    "first_fit_anchor_ids",
    "first_fit_groups",
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

#: how ``key_mode=similarity`` groups observation texts: ``dice_components`` (this project's: connected components of
#: 5-byte shingle Dice >= t, order-independent) or ``difflib_first_fit`` (the reference's: difflib ratio >= t against
#: the first member of each cluster, greedy in row order, order-dependent)
SIMILARITY_GROUPINGS = ("dice_components", "difflib_first_fit")


def shingle_set(text: str) -> frozenset[bytes]:
    """All overlapping 5-byte substrings of ``text``'s UTF-8 encoding, or the whole encoding if shorter."""
    if not isinstance(text, str):
        raise ValueError(f"shingle_set needs a str, got {type(text).__name__}: {text!r}")
    data = text.encode("utf-8")
    if len(data) < SHINGLE_BYTES:
        return frozenset([data])
    return frozenset(data[i : i + SHINGLE_BYTES] for i in range(len(data) - SHINGLE_BYTES + 1))


def shingle_similarity(a: str, b: str) -> float:
    """Sorensen-Dice similarity of the shingle sets: ``2 |A & B| / (|A| + |B|)``, in [0, 1]."""
    sa, sb = shingle_set(a), shingle_set(b)
    return 2.0 * len(sa & sb) / (len(sa) + len(sb))


def similarity_groups(texts: Sequence[str] | np.ndarray, threshold: float, *, candidates: str = "auto") -> np.ndarray:
    """Connected components of "identical or shingle similarity >= threshold" over ``texts`` (n,).

    ``threshold`` in (0, 1] (1.0: exact equality); ``candidates``: ``"auto"`` (exact prefix filter within
    :data:`PREFIX_PAIR_BUDGET`, else MinHash-LSH), ``"exact"`` or ``"lsh"``. Returns (n,) int64 ids in [0, G), numbered
    in the sorted order of each group's smallest text, so independent of the input order.
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


def difflib_ratio(a: str, b: str) -> float:
    """``SequenceMatcher(None, a, b).ratio()`` = 2 M / (len(a) + len(b)), autojunk on as the reference calls it.

    Not symmetric: the reference passes the new text as ``a`` and the cluster's first member as ``b``.
    """
    return SequenceMatcher(None, a, b).ratio()


def first_fit_groups(texts: Sequence[str] | np.ndarray, threshold: float) -> np.ndarray:
    """The reference's greedy first-fit clustering of ``texts`` (n,) in input order; order-dependent.

    Text i joins the first cluster whose first member r has ``difflib_ratio(text_i, r) >= threshold``, else starts one.
    Returns (n,) int64 cluster ids numbered by first appearance.
    """
    check_similarity_threshold(threshold)
    arr = _as_text_array(texts, "texts")
    out = np.empty(arr.shape[0], dtype=np.int64)  # (n,)
    matchers: list[SequenceMatcher] = []  # one per cluster, seq2 = its first member (b's tables built once)
    decided: dict[str, int] = {}
    for i, text in enumerate(arr.tolist()):
        cluster = decided.get(text)
        if cluster is None:
            cluster = len(matchers)
            for c, matcher in enumerate(matchers):
                matcher.set_seq1(text)
                if (
                    matcher.real_quick_ratio() >= threshold
                    and matcher.quick_ratio() >= threshold
                    and matcher.ratio() >= threshold
                ):
                    cluster = c
                    break
            if cluster == len(matchers):
                matchers.append(SequenceMatcher(None, "", text))
            decided[text] = cluster
        out[i] = cluster
    return out


def first_fit_anchor_ids(
    anchor_keys: Sequence[Any] | np.ndarray,
    group_ids: Sequence[Any] | np.ndarray,
    threshold: float,
    *,
    row_mask: np.ndarray | None = None,
) -> np.ndarray:
    """Anchor-group ids (N,) int64 under :func:`first_fit_groups` within each episode group, in row order.

    ``anchor_keys`` (N,) str, ``group_ids`` (N,), ``row_mask`` (N,) bool: masked rows get -1.
    """
    threshold = check_similarity_threshold(threshold)
    groups = as_id_array(group_ids, "group_ids")
    keys = as_id_array(anchor_keys, "anchor_keys", groups.shape[0], other="group_ids")
    keep = as_row_mask(row_mask, keys.shape[0])  # (N,) bool
    out = np.full(keys.shape[0], -1, dtype=np.int64)  # (N,)
    rows = np.flatnonzero(keep)  # (M,) in row order
    if rows.shape[0] == 0:
        return out
    texts = _as_text_array(keys[rows], "anchor_keys")
    g = id_codes(groups[rows], "group_ids")  # (M,)
    order = np.argsort(g, kind="stable")  # (M,) by episode group, row order kept inside each
    offset = 0
    for members in np.split(order, np.flatnonzero(np.diff(g[order])) + 1):
        local = first_fit_groups(texts[members], threshold)
        out[rows[members]] = local + offset
        offset += int(local.max()) + 1
    return out


def anchor_group_ids(
    anchor_keys: Sequence[Any] | np.ndarray,
    group_ids: Sequence[Any] | np.ndarray,
    similarity_threshold: float | None = None,
    *,
    row_mask: np.ndarray | None = None,
) -> np.ndarray:
    """Anchor-group id per row: same episode group and matching anchor keys.

    ``anchor_keys`` (N,) hashable (str for similarity), ``group_ids`` (N,), ``row_mask`` (N,) bool (False: id -1).
    Keys match exactly when ``similarity_threshold`` is None or 1.0, else by :func:`similarity_groups` within each
    episode group. Returns (N,) int64 ids in [0, K); the partition does not depend on the row order.
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
    """Component ids (D,) over distinct ``docs`` (D,) of "same block and similarity >= threshold"."""
    num_docs = docs.shape[0]
    if threshold >= 1.0 or num_docs < 2:
        return np.arange(num_docs, dtype=np.int64)
    budget = PREFIX_PAIR_BUDGET + 50 * num_docs if pair_budget is None else pair_budget
    doc, code = _shingles(docs)  # (S,), (S,) one entry per distinct (doc, shingle), sorted by doc
    size = np.bincount(doc, minlength=num_docs)  # (D,) |A|
    codes, code_id = sorted_unique(code)  # (V,) distinct shingle codes, (S,) dense shingle ids
    # shingles of different blocks are different tokens:
    token = sorted_unique((blocks[doc] << 32) | code_id)[1] if blocks.max(initial=0) > 0 else code_id
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
    verifier = Verifier(rank_s, start, size, threshold)
    if num_prefix_pairs > budget:  # low-entropy text: frequent shingles everywhere, prefix filtering would compare
        del posting  # almost all pairs
        block_of_doc = np.zeros(num_docs, dtype=np.int64)
        block_of_doc[doc] = blocks[doc]
        return lsh_components(docs, code_id, codes, start, size, block_of_doc, verifier, threshold)
    a, b = pairs_in_runs(posting >> 32, posting & 0xFFFFFFFF)
    a, b = fit_sizes(a, b, size, jaccard_t)
    logger.debug("similarity grouping: %d texts, %d candidate pairs by prefix filter (exact)", num_docs, a.shape[0])
    return connected_components(num_docs, *verifier.edges(a, b))


def _shingles(docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct (doc, shingle code) pairs of ``docs``, sorted; a text under 5 bytes gets ``(k + 1) << 40 | bytes``."""
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
    """Return ``threshold`` as a float when it is a number in (0, 1]; else one error naming the key."""
    ok = isinstance(threshold, (int, float, np.integer, np.floating)) and not isinstance(threshold, (bool, np.bool_))
    if not ok or math.isnan(threshold) or not 0.0 < threshold <= 1.0:
        raise KeyValueError(
            "similarity_threshold",
            threshold,
            "must be a number in (0, 1]: 1.0 = exact match, 0.9 = texts whose "
            "5-byte shingle sets have Dice similarity >= 0.9 (observations that differ in a few words)",
        )
    return float(threshold)


def check_similarity_grouping(value: Any) -> str:
    """Return ``value`` when it is one of :data:`SIMILARITY_GROUPINGS`; else one error naming the key."""
    if value not in SIMILARITY_GROUPINGS:
        raise KeyValueError(
            "similarity_grouping",
            value,
            f"must be one of {list(SIMILARITY_GROUPINGS)}: dice_components = connected "
            "components of 5-byte shingle Dice >= threshold (order-independent, the default); difflib_first_fit = "
            "difflib ratio >= threshold against each cluster's first member, greedy in row order (the reference's)",
        )
    return value


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
