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
       vocabulary is small (at most :data:`verl_gigpo.advantage._similarity_graph.BITSET_WORDS` words in all); otherwise
       an exact upper bound (per-bucket shingle counts) and then set intersections that skip already-connected
       pairs. LSH verifies a band's pairs with each bucket's first text before the others, so most pairs of a
       near-duplicate bucket are skipped as already connected.
    Code: steps 1, 2 and the shingles here; step 3 in :mod:`verl_gigpo.advantage._lsh`; step 4 and the components in
    :mod:`verl_gigpo.advantage._similarity_graph`.
    Measured (benchmarks/RESULTS.md, 2 shared CPU cores): 10,000 ALFWorld-like observations of ~300 characters
    (duplicates, near-duplicates, distinct ones from a 16-word object vocabulary) take ~1.1-1.6 s through the
    LSH path, with exactly the partition of the exact path (checked; the exact path needs 15-80 s and 8 GB
    there); 10,000 free-text observations (3,000-word vocabulary) stay on the exact path and take ~0.7-1.0 s;
    10,000 dense near-duplicates ``"You are in the middle of a room. step {i}"`` take ~0.5-0.8 s with a
    tracemalloc peak of ~34 MB (before the bucket splitting: 3,000 of them took 10 s and 1.6 GB, 10,000 did
    not fit in memory).

The reference implementation's grouping, as an option (:func:`first_fit_anchor_ids`, ``similarity_grouping =
"difflib_first_fit"``): difflib's ``SequenceMatcher.ratio`` with greedy first-fit clustering in row order. It depends
on the row order; docs/estimators.md, "Similarity grouping", gives its cost.
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


def difflib_ratio(a: str, b: str) -> float:
    """difflib's ``SequenceMatcher(None, a, b).ratio()`` = 2 M / (len(a) + len(b)), M the matched characters
    (autojunk on, as the reference calls it: in a ``b`` of 200+ characters, characters more frequent than 1% + 1 are
    junk). Not symmetric in general: the reference passes the new text as ``a``, the cluster's first member as ``b``."""
    return SequenceMatcher(None, a, b).ratio()


def first_fit_groups(texts: Sequence[str] | np.ndarray, threshold: float) -> np.ndarray:
    """Greedy first-fit clustering in input order (the reference's ``build_step_group`` with similarity on): text i
    joins the first cluster c whose first member r_c has ``difflib_ratio(text_i, r_c) >= threshold``, else starts a
    new cluster. Order-dependent: permuting the input can change the partition.

    Exactly the reference's clusters; identical texts are decided once (a text always joins the cluster its first
    copy joined, as the clusters before it never change), and difflib's cheap upper bounds
    (``real_quick_ratio``, ``quick_ratio``) skip pairs that cannot reach the threshold.

    Args:
        texts: ``(n,)`` str.
        threshold: in (0, 1].

    Returns:
        ``(n,)`` int64 cluster ids, numbered by first appearance.

    Raises:
        ValueError: a threshold outside (0, 1], or a non-str entry (naming its index and type).
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
    """Anchor-group id of each row under the reference's grouping: :func:`first_fit_groups` of the str keys of each
    episode group, in row order. The ids serve as exact anchor keys (any two rows with one id share an anchor group).

    Args:
        anchor_keys: ``(N,)`` str observation texts.
        group_ids: ``(N,)`` hashables, the episode group of each row.
        threshold: in (0, 1].
        row_mask: optional ``(N,)`` bool array or tensor; rows with False take part in no cluster and get id -1.

    Returns:
        ``(N,)`` int64 ids (-1 for masked rows), distinct across episode groups.

    Raises:
        ValueError: as :func:`anchor_group_ids` in similarity mode.
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
        raise KeyValueError(
            "similarity_threshold",
            threshold,
            "must be a number in (0, 1]: 1.0 = exact match, 0.9 = texts whose "
            "5-byte shingle sets have Dice similarity >= 0.9 (observations that differ in a few words)",
        )
    return float(threshold)


def check_similarity_grouping(value: Any) -> str:
    """Return ``value`` when it is one of :data:`SIMILARITY_GROUPINGS`.

    Raises:
        ValueError: naming ``similarity_grouping``, the value and what each grouping is.
    """
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
