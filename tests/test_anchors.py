"""CPU tests of anchor grouping (verl_gigpo.advantage.anchors): similarity grouping against a brute-force all-pairs
oracle (tests/helpers/gigpo_oracle.py), order independence, exact mode, per-episode-group grouping, validation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

# all pairs, union-find: the definition of the grouping, written the slow obvious way (tests/helpers/gigpo_oracle.py)
from gigpo_oracle import brute_force_similarity_groups as _brute_force_groups

from verl_gigpo.advantage import _similarity_graph, anchors, gigpo_advantage_terms
from verl_gigpo.advantage.anchors import (
    anchor_group_ids,
    shingle_set,
    shingle_similarity,
    similarity_groups,
)

ROOM = (
    "You arrive at countertop 1. On the countertop 1, you see a apple 1, a bread 2, a butterknife 3, a cup 1, "
    "a dishsponge 2, a fork 1, a lettuce 2, a peppershaker 1, a plate 2, a saltshaker 3, and a spatula 1."
)
OTHER = "You are facing the drawer 4. The drawer 4 is closed. Nothing happens when you wait here for a while."


def _same_partition(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return len(set(zip(a.tolist(), b.tolist(), strict=True))) == len(set(a.tolist())) == len(set(b.tolist()))


def test_shingle_similarity_definition():
    assert shingle_set("abcdef") == {b"abcde", b"bcdef"}
    assert shingle_set("abc") == {b"abc"}  # shorter than a shingle: the whole text
    assert shingle_similarity("abcdef", "abcdef") == 1.0
    assert shingle_similarity("abcdef", "abcdeX") == pytest.approx(2 * 1 / (2 + 2))  # shares "abcde"
    assert shingle_similarity("abc", "xyz") == 0.0
    assert shingle_similarity(ROOM, OTHER) < 0.2
    a, b = ROOM, ROOM.replace("apple 1", "apple 2")  # one character: 5 of ~190 shingles change
    assert shingle_similarity(a, b) == shingle_similarity(b, a) > 0.97
    assert shingle_similarity("é日本語", "é日本語!") > 0.5  # UTF-8 bytes, multi-byte characters are fine


def test_identical_strings_share_a_group():
    texts = [OTHER, ROOM, OTHER, "", "", "x", ROOM]
    for threshold in (1.0, 0.9, 0.5, 1e-9):
        labels = similarity_groups(texts, threshold)
        assert labels.dtype == np.int64 and labels.shape == (7,)
        assert labels[0] == labels[2] and labels[1] == labels[6] and labels[3] == labels[4]


def test_near_duplicates_merge_and_unrelated_stay_apart_at_0_9():
    variants = [
        ROOM,
        ROOM.replace("apple 1", "apple 2"),
        ROOM.replace("bread 2", "egg 2").replace("fork 1", "knife 1"),
        ROOM.replace("lettuce", "tomato"),
    ]
    unrelated = [OTHER, "You pick up the apple 1 from the countertop 1.", "Nothing happens."]
    labels = similarity_groups(variants + unrelated, 0.9)
    assert len(set(labels[:4].tolist())) == 1  # one anchor state for all variants of the room
    assert len(set(labels.tolist())) == 4  # each unrelated text alone
    exact = similarity_groups(variants + unrelated, 1.0)
    assert len(set(exact.tolist())) == 7  # threshold 1.0: exact match only


def test_threshold_one_is_exact_match():
    # "aaaaaa" and "aaaaaaa" have the same shingle set {"aaaaa"} (similarity 1.0) but are different strings:
    # threshold 1.0 means string equality, so they stay apart; any threshold below 1 merges them.
    assert shingle_similarity("aaaaaa", "aaaaaaa") == 1.0
    rng = np.random.default_rng(0)
    texts = [str(x) for x in rng.choice(["ab", "abc", "aaaaaa", "aaaaaaa", ROOM, ROOM + " "], size=50)]
    labels = similarity_groups(texts, 1.0)
    _, expected = np.unique(np.array(texts, dtype=object), return_inverse=True)
    np.testing.assert_array_equal(labels, expected)  # canonical labels = rank of the sorted distinct texts
    merged = similarity_groups(["aaaaaa", "aaaaaaa"], 0.999)
    assert merged[0] == merged[1]


def test_grouping_is_transitive_chaining():
    # a ~ b and b ~ c but not a ~ c: connected components put all three together, whatever the order.
    a = "the quick brown fox jumps over the lazy dog near the river bank today"
    b = a.replace("lazy dog", "lazy cat")
    c = b.replace("river bank", "river side")
    t = 0.85
    assert shingle_similarity(a, b) >= t and shingle_similarity(b, c) >= t and shingle_similarity(a, c) < t
    for order in ([a, b, c], [a, c, b], [c, a, b]):
        assert len(set(similarity_groups(order, t).tolist())) == 1


def test_matches_brute_force_and_is_order_independent():
    # Random corpora of near-duplicate word sequences: the fast grouping (prefix-filtered candidates, exact
    # verification) must give exactly the all-pairs partition, and canonical labels under any permutation.
    rng = np.random.default_rng(1)
    words = "you see a the apple bread knife fridge cabinet drawer 1 2 3 on in at é 日本".split()
    for trial in range(150):
        bases = [" ".join(rng.choice(words, size=int(rng.integers(0, 14)))) for _ in range(int(rng.integers(1, 6)))]
        texts = []
        for _ in range(int(rng.integers(1, 30))):
            tokens = bases[int(rng.integers(len(bases)))].split(" ")
            for _ in range(int(rng.integers(0, 3))):
                tokens[int(rng.integers(len(tokens)))] = str(rng.choice(words))
            texts.append(" ".join(tokens))
        threshold = float(rng.choice([0.2, 0.5, 0.7, 0.8, 0.9, 0.95]))
        labels = similarity_groups(texts, threshold)
        assert _same_partition(labels, _brute_force_groups(texts, threshold)), (trial, threshold, texts)
        perm = rng.permutation(len(texts))
        np.testing.assert_array_equal(similarity_groups([texts[i] for i in perm], threshold), labels[perm])


@pytest.mark.parametrize("candidates", ["lsh", "exact"])
@pytest.mark.parametrize("bitsets", [True, False])
def test_candidate_paths_match_brute_force(candidates, bitsets, monkeypatch):
    # Low-entropy observations (one template, few object words): the case where "auto" switches to
    # MinHash-LSH. Both candidate generators and both verifiers must give the all-pairs partition here.
    if not bitsets:
        monkeypatch.setattr(_similarity_graph, "BITSET_WORDS", 0)  # force the set-intersection verifier
    rng = np.random.default_rng(4)
    objects = "apple bread cup egg fork knife mug pan".split()
    for _ in range(4):
        bases = [[f"a {rng.choice(objects)} {rng.integers(1, 4)}" for _ in range(8)] for _ in range(12)]
        texts = []
        for _ in range(60):
            items = list(bases[int(rng.integers(len(bases)))])
            for _ in range(int(rng.integers(0, 3))):
                items[int(rng.integers(len(items)))] = f"a {rng.choice(objects)} {rng.integers(1, 4)}"
            texts.append("On the countertop 1, you see " + ", ".join(items) + ".")
        for threshold in (0.8, 0.9):
            labels = similarity_groups(texts, threshold, candidates=candidates)
            assert _same_partition(labels, _brute_force_groups(texts, threshold))
            np.testing.assert_array_equal(labels, similarity_groups(texts, threshold))  # "auto" agrees


def test_lsh_bands_meet_the_miss_target():
    for threshold in (0.5, 0.8, 0.9, 0.95):
        r, b = anchors.lsh_bands(threshold)
        jaccard = threshold / (2 - threshold)
        assert r * b <= anchors.LSH_BINS and (1 - jaccard**r) ** b <= anchors.LSH_MISS
        assert r == anchors.LSH_BINS or (1 - jaccard ** (r + 1)) ** (anchors.LSH_BINS // (r + 1)) > anchors.LSH_MISS
    assert anchors.lsh_bands(0.9) == (8, 32)


def _dense_room_texts(n, fmt="{i}"):
    """Dense near-duplicates: one sentence and a counter, so every text shares most shingles with every other."""
    return [f"You are in the middle of a room. step {fmt.format(i=i)}" for i in range(n)]


@pytest.mark.parametrize(("fmt", "threshold"), [("{i}", 0.9), ("{i:04d}", 0.95), ("{i}", 0.97)])
def test_dense_near_duplicate_buckets_are_split_and_match_brute_force(fmt, threshold, caplog):
    # 600 texts that share all but their last few shingles: their LSH buckets hold hundreds of texts, more than
    # LSH_BUCKET_MAX, so the bucket-splitting path runs; the partition must still be the all-pairs one
    # ({i}, 0.9: one group through chains; {i:04d}, 0.95: one group per shared 3-digit prefix; {i}, 0.97: one
    # group linked only through one-shingle differences), and it must not depend on the input order.
    texts = _dense_room_texts(600, fmt)
    with caplog.at_level("DEBUG", logger="verl_gigpo.advantage._lsh"):  # the LSH path logs its bucket counts
        labels = similarity_groups(texts, threshold, candidates="lsh")
    split = [r.getMessage() for r in caplog.records if "bucket members split" in r.getMessage()]
    assert split and " 0 bucket members split" not in split[-1]
    assert _same_partition(labels, _brute_force_groups(texts, threshold))
    perm = np.random.default_rng(0).permutation(len(texts))
    np.testing.assert_array_equal(similarity_groups([texts[i] for i in perm], threshold), labels[perm])


def test_dense_near_duplicates_take_memory_linear_in_the_input():
    # Before bucket splitting, every pair of a dense LSH bucket was built at once: 3,000 of these texts took a
    # 1.6 GB tracemalloc peak (10,000 did not fit in memory). Now the peak is the per-band pairs (at most
    # LSH_BUCKET_MAX / 2 per text) and the shingle bitsets: a few KB per text.
    import tracemalloc

    texts = _dense_room_texts(3000)
    tracemalloc.start()
    try:
        labels = similarity_groups(texts, 0.9)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3000 * 5_000, f"peak {peak / 2**20:.1f} MB"
    assert labels.max() == 0  # all linked: "step 199" ~ "step 200" ~ "step 2000" ...


def test_labels_are_canonical():
    texts = ["zeta", "alpha", "zeta", "mid"]
    np.testing.assert_array_equal(similarity_groups(texts, 0.9), [2, 0, 2, 1])  # numbered by smallest text
    np.testing.assert_array_equal(similarity_groups(np.array(texts), 0.9), [2, 0, 2, 1])  # a numpy str array


def test_empty_input():
    out = similarity_groups([], 0.9)
    assert out.dtype == np.int64 and out.shape == (0,)
    assert anchor_group_ids([], [], 0.9).shape == (0,)


@pytest.mark.parametrize("threshold", [0.0, -0.5, 1.5, float("nan"), True, "0.9", None])
def test_similarity_threshold_validation(threshold):
    with pytest.raises(ValueError, match=r"similarity_threshold=.* \(0, 1\]"):
        similarity_groups(["a", "b"], threshold)


def test_candidates_option_validation():
    with pytest.raises(ValueError, match=r"candidates='minhash'.*'auto', 'exact' or 'lsh'"):
        similarity_groups(["a", "b"], 0.9, candidates="minhash")


def test_non_text_input_is_rejected():
    with pytest.raises(ValueError, match=r"texts\[1\] is a int \(3\).*str"):
        similarity_groups(["a", 3], 0.9)
    with pytest.raises(ValueError, match=r"texts must be 1-D"):
        similarity_groups(np.array([["a", "b"]]), 0.9)
    with pytest.raises(ValueError, match=r"anchor_keys\[0\] is a tuple"):
        anchor_group_ids([(1, 2), (1, 2)], ["g", "g"], 0.9)


def test_anchor_group_ids_exact_mode():
    keys = np.fromiter([(0, "a"), (0, "a"), (1, "a"), (0, "a"), "s"], dtype=object, count=5)
    groups = np.array(["g1", "g1", "g1", "g2", "g2"], dtype=object)
    for threshold in (None, 1.0):
        ids = anchor_group_ids(keys, groups, threshold)
        assert ids.dtype == np.int64
        # rows 0 and 1 share key and group; row 3 has the same key in another group.
        assert ids[0] == ids[1] and len(set(ids.tolist())) == 4


def test_anchor_group_ids_similarity_stays_within_episode_groups():
    a = "the quick brown fox jumps over the lazy dog near the river bank today"
    b = a.replace("lazy dog", "lazy cat")
    c = b.replace("river bank", "river side")  # a ~ b ~ c, a !~ c at 0.85
    keys = [a, c, b, a.replace("today", "now!"), b]
    groups = ["g1", "g1", "g2", "g1", "g1"]
    ids = anchor_group_ids(keys, groups, 0.85)
    # In g1: a, c, a', b -> a ~ a' ~ b ~ c: one group. In g2: b alone, never merged with g1's texts.
    assert ids[0] == ids[1] == ids[3] == ids[4] and ids[2] != ids[0]
    ids = anchor_group_ids(keys[:4], groups[:4], 0.85)  # without g1's b, a and c are only linked through g2's b
    assert ids[0] == ids[3] and ids[1] != ids[0]
    rng = np.random.default_rng(2)
    for _ in range(10):  # the partition does not depend on the row order
        perm = rng.permutation(5)
        permuted = anchor_group_ids([keys[i] for i in perm], [groups[i] for i in perm], 0.85)
        assert _same_partition(permuted, anchor_group_ids(keys, groups, 0.85)[perm])


def test_anchor_group_ids_feed_the_estimator():
    # Ids from anchor_group_ids(exact) as anchor_keys give the same advantages as the raw keys.
    rng = np.random.default_rng(3)
    n = 40
    groups = rng.integers(0, 3, size=n)
    trajs = groups * 10 + rng.integers(0, 3, size=n)
    steps = np.zeros(n, dtype=np.int64)
    for t in np.unique(trajs):
        steps[trajs == t] = rng.permutation(int((trajs == t).sum()))
    keys = np.array([f"state {k}" for k in rng.integers(0, 4, size=n)], dtype=object)
    rewards = torch.from_numpy(rng.normal(size=n))
    args = (rewards, torch.ones(n, 2), groups, trajs, steps)
    direct = gigpo_advantage_terms(*args, keys)
    via_ids = gigpo_advantage_terms(*args, anchor_group_ids(keys, groups))
    np.testing.assert_array_equal(via_ids.advantage, direct.advantage)
    np.testing.assert_array_equal(via_ids.anchor_group_size, direct.anchor_group_size)


def test_anchor_group_ids_row_mask():
    # Masked rows (padding, failed episodes) are skipped, even with keys that would be invalid, and get -1.
    keys = np.array(["room a", "room a!", None, "room a"], dtype=object)
    groups = ["g", "g", "g", "g"]
    mask = np.array([True, True, False, True])
    ids = anchor_group_ids(keys, groups, 0.5, row_mask=mask)
    assert ids[2] == -1 and ids[0] == ids[1] == ids[3] >= 0
    np.testing.assert_array_equal(anchor_group_ids(keys, groups, row_mask=mask)[[0, 3]], [0, 0])
    with pytest.raises(ValueError, match=r"row_mask .*bool.*shape \(4,\)"):
        anchor_group_ids(keys, groups, row_mask=np.ones(4, dtype=int))


def test_anchor_group_ids_validation():
    with pytest.raises(ValueError, match=r"anchor_keys has 2 .*group_ids has 3"):
        anchor_group_ids(["a", "b"], ["g", "g", "g"])
    with pytest.raises(ValueError, match=r"anchor_keys\[1\] is missing"):
        anchor_group_ids(np.array(["a", None], dtype=object), ["g", "g"])
    # the message of every id check (verl_gigpo.advantage._ids, shared with the estimators): the row, the value, the fix
    with pytest.raises(ValueError, match=r"anchor_keys\[0\] = \['a'\] .*hashable.*str, int or tuple"):
        keys = np.empty(2, dtype=object)
        keys[0], keys[1] = ["a"], ["b"]  # lists are not hashable
        anchor_group_ids(keys, ["g", "g"])
    with pytest.raises(ValueError, match=r"similarity_threshold=2\.0 .*\(0, 1\]"):
        anchor_group_ids(["a", "b"], ["g", "g"], 2.0)
    # The threshold is checked before anything else: True (== 1.0 in Python) was taken for exact keys, and an
    # empty batch skipped the check.
    with pytest.raises(ValueError, match=r"similarity_threshold=True .*\(0, 1\]"):
        anchor_group_ids(["a", "b"], ["g", "g"], True)
    with pytest.raises(ValueError, match=r"similarity_threshold=2.0 must be"):
        anchor_group_ids([], [], 2.0)


# ------------------------------------------------------------------------------------------ the reference's grouping
DRAWERS = ("You arrive at drawer 4. The drawer 4 is closed.", "You arrive at drawer 3. The drawer 3 is closed.")
SEARCHES = ("search results for: capital of france page 1", "search results for: capital of spain page 1")


def _loop_first_fit(texts, threshold):
    """The reference's build_step_group (similarity on) for one episode group, written as its loop: each text joins the
    first cluster whose first member r has SequenceMatcher(None, text, r).ratio() >= threshold."""
    from difflib import SequenceMatcher

    reps, out = [], []
    for text in texts:
        for c, rep in enumerate(reps):
            if SequenceMatcher(None, text, rep).ratio() >= threshold:
                out.append(c)
                break
        else:
            reps.append(text)
            out.append(len(reps) - 1)
    return out


@pytest.mark.parametrize(("pair", "ratio", "dice"), [(DRAWERS, 0.957, 0.763), (SEARCHES, 0.920, 0.759)])
def test_first_fit_groups_one_word_pairs_that_dice_does_not(pair, ratio, dice):
    assert round(anchors.difflib_ratio(*pair), 3) == ratio and round(shingle_similarity(*pair), 3) == dice
    assert anchors.first_fit_groups(list(pair), 0.9).tolist() == [0, 0]
    assert similarity_groups(list(pair), 0.9).tolist() in ([0, 1], [1, 0])  # the default keeps them apart
    ids = anchors.first_fit_anchor_ids([*pair, *pair], ["g", "g", "h", "h"], 0.9)
    assert ids.tolist() == [0, 0, 1, 1]  # never across episode groups
    assert len(set(anchor_group_ids([*pair, *pair], ["g", "g", "h", "h"], 0.9).tolist())) == 4


def test_first_fit_groups_equal_the_reference_loop():
    rng = np.random.default_rng(0)
    words = ["drawer", "cabinet", "apple", "closed", "open", "1", "2", "3", "you", "see", "a", "the"]
    base = [" ".join(rng.choice(words, size=int(rng.integers(3, 60)))) for _ in range(12)]
    assert max(map(len, base)) > 200  # difflib's autojunk applies to the longer ones
    for trial in range(4):
        texts = [b if rng.random() < 0.5 else b.replace("1", "2", 1) for b in rng.choice(base, size=30)]
        for threshold in (0.4, 0.9, 1.0):  # 0.4 merges unrelated texts of one vocabulary: first fit matters there
            assert anchors.first_fit_groups(texts, threshold).tolist() == _loop_first_fit(texts, threshold), trial


def test_first_fit_groups_depend_on_row_order():
    a, b, c = "aaaaaaaaab", "aaaaaaaabb", "aaaaaaabbb"  # a~b and b~c at 0.9, a and c not (ratio 0.8)
    assert anchors.first_fit_groups([a, b, c], 0.9).tolist() == [0, 0, 1]
    assert anchors.first_fit_groups([b, a, c], 0.9).tolist() == [0, 0, 0]
    assert similarity_groups([a, b, c], 0.9).tolist() == similarity_groups([b, a, c], 0.9)[[1, 0, 2]].tolist()


def test_first_fit_anchor_ids_mask_and_errors():
    keys, groups = [DRAWERS[0], DRAWERS[1], 7], ["g", "g", "g"]
    ids = anchors.first_fit_anchor_ids(keys, groups, 0.9, row_mask=torch.tensor([True, True, False]))
    assert ids.tolist() == [0, 0, -1]  # the masked row is never read
    with pytest.raises(ValueError, match=r"anchor_keys\[2\] is a int"):
        anchors.first_fit_anchor_ids(keys, groups, 0.9)
    with pytest.raises(ValueError, match="similarity_grouping='difflib'"):
        anchors.check_similarity_grouping("difflib")


def test_config_similarity_grouping_reaches_the_estimator():
    from verl_gigpo.config import GiGPOConfig

    # two episodes of one group: step 0 in drawer 4 / drawer 3, returns 1 and 0 (the second fails)
    args = (
        torch.tensor([1.0, 0.0]),
        torch.ones(2, 1),
        ["g", "g"],
        ["t0", "t1"],
        [0, 0],
        list(DRAWERS),
    )
    default = GiGPOConfig(key_mode="similarity").advantage_terms(*args)
    reference = GiGPOConfig(key_mode="similarity", similarity_grouping="difflib_first_fit").advantage_terms(*args)
    assert default.step_adv.tolist() == [0.0, 0.0]  # two singleton anchor groups
    assert reference.step_adv.tolist() == pytest.approx([0.7071, -0.7071], abs=1e-4)  # one group: (1 - .5) / std
    with pytest.raises(ValueError, match="similarity_grouping='x'"):
        GiGPOConfig(similarity_grouping="x")
    assert GiGPOConfig.from_mapping({"similarity_grouping": "difflib_first_fit"}).similarity_grouping == (
        "difflib_first_fit"
    )
