"""Anchor-state grouping: exact keys, and order-independent similarity grouping of free-text observations.

GiGPO compares actions taken from the same environment state (an *anchor state*) inside one episode group.
With exact keys that is plain equality of the anchor key. Free-text observations that differ only in a few
words (a counter, an object number) can instead be grouped by similarity; this module defines that similarity
precisely and groups by it in a way that does not depend on the order of the input.

Similarity measure (:func:`shingle_similarity`):
    Each text is encoded as UTF-8 and cut into its set of overlapping 3-byte shingles (for ASCII text: the set
    of character 3-grams; a text shorter than 3 bytes has one shingle, the whole text). The similarity of two
    texts with shingle sets A and B is the Sorensen-Dice coefficient ``2 |A & B| / (|A| + |B|)``, in [0, 1].
    For a ~300-character observation, changing one 6-letter word changes about 8 of ~300 shingles: similarity
    ~0.97; three words ~0.92; unrelated English text of that length is typically far below 0.5.

Grouping (:func:`similarity_groups`):
    Two texts are linked when they are identical or their similarity is >= threshold; the groups are the
    connected components of that graph. Components are transitive closures, so the partition is a function of
    the multiset of texts only: permuting the input permutes the labels of the same partition. Labels are
    canonical: component ids are numbered 0, 1, ... in the sorted order of each component's smallest text.
    ``threshold == 1.0`` means exact string equality (not "equal shingle sets").

How it scales:
    Exact duplicates are collapsed first (hash factorisation, O(n)). Candidate pairs are generated exactly by
    prefix filtering (as in all-pairs set-similarity joins): shingles are ordered globally by (document
    frequency, value) and each text indexes only its ``|A| - ceil(t' |A|) + 1`` rarest shingles, with
    ``t' = t / (2 - t)`` the Jaccard equivalent of Dice threshold t. Two texts with Dice >= t share at least
    ``ceil(t' |A|)`` shingles and therefore at least one indexed shingle, so candidate generation never misses a
    pair (no probabilistic hashing; fully deterministic). Candidates also pass a size filter and are then
    verified exactly; pairs already in the same component are skipped. Cost: O(S log S) for the S shingles of
    the distinct texts, plus the candidate pairs, which grow quadratically only with the number of *distinct*
    texts that are near-duplicates of one another (k distinct variants of one observation give up to k(k-1)/2
    candidates). 10,000 observations of ~300 characters with many duplicates and near-duplicates group in well
    under a second on one CPU core (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
import pandas as pd

__all__ = [
    "SHINGLE_BYTES",
    "anchor_group_ids",
    "hashable_key",
    "shingle_set",
    "shingle_similarity",
    "similarity_groups",
]

logger = logging.getLogger(__name__)

SHINGLE_BYTES = 5
"""Length of a shingle in bytes of the UTF-8 encoding (characters, for ASCII text)."""


def hashable_key(value: Any) -> Hashable:
    """A hashable, equality-preserving form of an anchor key: lists, tuples and arrays become tuples (nested),
    dicts become sorted tuples of (key, value), sets become sorted tuples, numpy scalars become Python scalars.

    Examples: ``[1, [2, 3]] -> (1, (2, 3))``; ``np.array([[0, 1], [1, 0]]) -> ((0, 1), (1, 0))``;
    ``{"b": 1, "a": [2]} -> (("a", (2,)), ("b", 1))``.

    Raises:
        ValueError: for a value that cannot be made hashable (e.g. a dict with unorderable keys).
    """
    if isinstance(value, np.ndarray):
        return hashable_key(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return tuple(hashable_key(v) for v in value)
    if isinstance(value, dict):
        try:
            return tuple(sorted((hashable_key(k), hashable_key(v)) for k, v in value.items()))
        except TypeError as err:
            raise ValueError(f"cannot make a key of dict {value!r}: its keys cannot be sorted ({err})") from err
    if isinstance(value, (set, frozenset)):
        try:
            return tuple(sorted(hashable_key(v) for v in value))
        except TypeError as err:
            raise ValueError(f"cannot make a key of set {value!r}: its items cannot be sorted ({err})") from err
    try:
        hash(value)
    except TypeError as err:
        raise ValueError(f"cannot make a hashable key of {type(value).__name__} {value!r}: {err}") from err
    return value


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


def similarity_groups(texts: Sequence[str] | np.ndarray, threshold: float) -> np.ndarray:
    """Group near-identical texts: connected components of "identical or shingle similarity >= threshold".

    See the module docstring for the similarity measure, why the partition is order-independent, how candidate
    pairs are found without misses, and how it scales.

    Args:
        texts: ``(n,)`` sequence or array of str.
        threshold: in (0, 1]; 1.0 = exact string equality.

    Returns:
        ``(n,)`` int64 group ids in ``[0, G)``; equal ids = same group. Ids are canonical: groups are numbered
        in the sorted order of their smallest text, so they do not depend on the input order.

    Raises:
        ValueError: a threshold outside (0, 1], or a non-str entry (naming its index and type).
    """
    _check_threshold(threshold)
    arr = _as_text_array(texts, "texts")
    n = arr.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    doc, uniques = pd.factorize(arr)  # (n,), (D,) exact duplicates collapse here
    doc = doc.astype(np.int64, copy=False)
    component = _components(uniques, np.zeros(len(uniques), dtype=np.int64), threshold)  # (D,)
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

    Returns:
        ``(N,)`` int64 ids in ``[0, K)``. The partition does not depend on the row order; the id values are
        numbered by first appearance and carry no meaning.

    Raises:
        ValueError: length mismatch, missing (None/NaN) or unhashable keys/ids, a threshold outside (0, 1], or
            non-str keys in similarity mode.
    """
    keys = _as_key_array(anchor_keys, "anchor_keys")
    groups = _as_key_array(group_ids, "group_ids")
    if keys.shape[0] != groups.shape[0]:
        raise ValueError(
            f"length mismatch: anchor_keys has {keys.shape[0]} entries but group_ids has {groups.shape[0]}"
        )
    if keys.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    g = _codes(groups, "group_ids")
    if similarity_threshold is None or similarity_threshold == 1.0:
        k = _codes(keys, "anchor_keys")
        return _codes(g * (int(k.max()) + 1) + k, "anchor groups")
    _check_threshold(similarity_threshold)
    texts = _as_text_array(keys, "anchor_keys")
    t = _codes(texts, "anchor_keys")
    pair = _codes(g * (int(t.max()) + 1) + t, "anchor groups")  # (N,) distinct (group, text)
    first = np.empty(int(pair.max()) + 1, dtype=np.int64)
    first[pair] = np.arange(pair.shape[0])
    component = _components(texts[first], g[first], similarity_threshold)  # (P,)
    return _codes(component[pair], "anchor groups")


# ----------------------------------------------------------------------------------------------------------------
# helpers


def _components(docs: np.ndarray, blocks: np.ndarray, threshold: float) -> np.ndarray:
    """Connected components over distinct texts ``docs`` (D,) of "same block and similarity >= threshold".

    Returns ``(D,)`` int64 component ids (arbitrary numbering).
    """
    num_docs = docs.shape[0]
    if threshold >= 1.0 or num_docs < 2:
        return np.arange(num_docs, dtype=np.int64)
    doc, code = _shingles(docs)  # (S,), (S,) one entry per distinct (doc, shingle), sorted by doc
    size = np.bincount(doc, minlength=num_docs)  # (D,) |A|
    token = _dense_ids(code)  # (S,) shingles of different blocks are different tokens:
    token = _dense_ids((blocks[doc] << 32) | token) if blocks.max(initial=0) > 0 else token
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

    # Candidate pairs: docs sharing an indexed shingle.
    rank_doc = np.sort((rank_s[keep] << 32) | doc[keep])  # posting lists: by token, then doc
    p_rank, p_doc = rank_doc >> 32, rank_doc & 0xFFFFFFFF
    run_start = np.flatnonzero(np.r_[True, p_rank[1:] != p_rank[:-1]])
    run_end = np.r_[run_start[1:], p_rank.shape[0]]
    partners = np.repeat(run_end, run_end - run_start) - np.arange(p_rank.shape[0]) - 1  # later docs in the run
    left = np.repeat(np.arange(p_rank.shape[0]), partners)
    offset = np.arange(left.shape[0]) - np.repeat(np.cumsum(partners) - partners, partners)
    pair = np.sort((p_doc[left] << 32) | p_doc[left + 1 + offset])  # a < b: docs are sorted inside a run
    pair = pair[np.r_[True, pair[1:] != pair[:-1]]] if pair.size else pair
    a, b = pair >> 32, pair & 0xFFFFFFFF
    small, large = np.minimum(size[a], size[b]), np.maximum(size[a], size[b])
    fits = small >= jaccard_t * large - 1e-9  # Dice >= t needs |small| / |large| >= t / (2 - t)
    a, b = a[fits], b[fits]
    logger.debug("similarity grouping: %d distinct texts, %d candidate pairs", num_docs, a.shape[0])

    # Exact verification with union-find; pairs already joined are skipped (they cannot change the partition).
    parent = list(range(num_docs))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    sets: dict[int, frozenset[int]] = {}
    starts = start.tolist()
    sizes = size.tolist()
    for x, y in zip(a.tolist(), b.tolist(), strict=True):
        rx, ry = find(x), find(y)
        if rx == ry:
            continue
        for d in (x, y):
            if d not in sets:
                sets[d] = frozenset(rank_s[starts[d] : starts[d] + sizes[d]].tolist())
        if 2.0 * len(sets[x] & sets[y]) / (sizes[x] + sizes[y]) >= threshold:
            parent[max(rx, ry)] = min(rx, ry)
    return np.fromiter((find(x) for x in range(num_docs)), dtype=np.int64, count=num_docs)


def _dense_ids(x: np.ndarray) -> np.ndarray:
    """Dense ids ``[0, K)`` of the distinct values of an int64 array, in sorted order (sort-based)."""
    order = np.argsort(x, kind="stable")
    xs = x[order]
    ids = np.empty(x.shape[0], dtype=np.int64)
    ids[order] = np.cumsum(np.r_[False, xs[1:] != xs[:-1]]) if x.size else 0
    return ids


def _shingles(docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct (doc, shingle code) pairs of the texts ``docs``, sorted by doc then code.

    A shingle of bytes ``b0 .. b4`` has code ``b0 << 32 | b1 << 24 | ... | b4`` (< 2^40); a text of ``k < 5``
    bytes has the single code ``(k + 1) << 40 | bytes``, which no full shingle can take.
    """
    w = SHINGLE_BYTES
    encoded = [s.encode("utf-8") for s in docs.tolist()]
    lengths = np.fromiter((len(e) for e in encoded), dtype=np.int64, count=len(encoded))  # (D,)
    data = np.frombuffer(b"".join(encoded) + bytes(w), dtype=np.uint8).astype(np.int64)  # (B + w,) zero-padded
    ends = np.cumsum(lengths)
    starts = ends - lengths
    doc_of_byte = np.repeat(np.arange(len(encoded)), lengths)  # (B,)
    pos = np.flatnonzero(np.arange(doc_of_byte.shape[0]) + w <= ends[doc_of_byte])  # a full shingle starts here
    doc = doc_of_byte[pos]
    code = np.zeros(pos.shape[0], dtype=np.int64)
    for k in range(w):
        code |= data[pos + k] << (8 * (w - 1 - k))
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


def _check_threshold(threshold: Any) -> None:
    ok = isinstance(threshold, (int, float, np.integer, np.floating)) and not isinstance(threshold, bool)
    if not ok or not 0.0 < threshold <= 1.0 or math.isnan(threshold):
        raise ValueError(
            f"similarity threshold must be a number in (0, 1], got {threshold!r}; 1.0 = exact match, "
            "0.9 = texts whose 5-gram shingle sets have Dice similarity >= 0.9 (a few words differ)"
        )


def _as_key_array(values: Any, name: str) -> np.ndarray:
    if isinstance(values, np.ndarray):
        arr = values
    elif isinstance(values, Sequence) and not isinstance(values, (str, bytes)):
        arr = np.fromiter(values, dtype=object, count=len(values))  # keeps tuples whole
    else:
        raise ValueError(f"{name} must be a 1-D array or sequence, got {type(values).__name__}")
    if arr.ndim != 1:
        raise ValueError(
            f"{name} must be 1-D with one key per row; got shape {arr.shape} (for tuple keys use "
            "np.fromiter(keys, dtype=object, count=n))"
        )
    return arr


def _as_text_array(values: Any, name: str) -> np.ndarray:
    arr = _as_key_array(values, name)
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


def _codes(values: np.ndarray, name: str) -> np.ndarray:
    try:
        codes, _ = pd.factorize(values)
    except TypeError as err:
        raise ValueError(f"{name} holds an unhashable value ({err}); convert keys with hashable_key()") from err
    missing = np.flatnonzero(codes < 0)
    if missing.size:
        i = int(missing[0])
        raise ValueError(f"{name}[{i}] is missing ({values[i]!r}); every row needs a key")
    return codes.astype(np.int64, copy=False)
