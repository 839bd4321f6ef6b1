"""The CPU platform's micro-batch split: rows of similar length together (verl_gigpo/verl_glue/cpu/micro_batches.py),
and the shim that puts it into verl's dynamic split (``length_sorted_micro_batches``), on real verl TensorDicts."""

from __future__ import annotations

import random

import pytest
import torch

from verl_gigpo.verl_glue.cpu.micro_batches import padded_tokens, sorted_partition


def _random_lengths(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(18, 35) if rng.random() > 0.06 else rng.randint(70, 84) for _ in range(n)]


def test_hand_computed_split():
    # lengths 5, 1, 3, 3, 9 with 9 padded tokens: [1] then 3, 3 (2 x 3 = 6; 3 x 5 = 15 > 9), then 5, then 9
    assert sorted_partition([5, 1, 3, 3, 9], 9) == [[1, 2, 3], [0], [4]]
    assert sorted_partition([5, 1, 3, 3, 9], 100) == [[0, 1, 2, 3, 4]]  # 5 x 9 = 45 <= 100: one micro-batch


@pytest.mark.parametrize("seed", range(20))
def test_every_row_once_within_the_budget_shortest_first(seed):
    lengths = _random_lengths(seed, 200)
    budget = random.Random(seed).choice([90, 256, 1024])
    parts = sorted_partition(lengths, budget)
    assert sorted(i for p in parts for i in p) == list(range(200))
    for part in parts:
        assert part == sorted(part)
        assert padded_tokens(lengths, part) <= budget or len(part) == 1  # a row longer than the budget: alone
    longest = [max(lengths[i] for i in p) for p in parts]
    shortest = [min(lengths[i] for i in p) for p in parts]
    assert all(a <= b for a, b in zip(longest, shortest[1:], strict=False))  # groups do not interleave


def test_sorting_cuts_the_padding_of_a_shuffled_split():
    lengths = _random_lengths(0, 320)
    fixed = [list(range(i, i + 16)) for i in range(0, 320, 16)]  # verl's fixed split of 16 rows (shuffled order)
    sorted_parts = sorted_partition(lengths, 16 * 35)
    real = sum(lengths)
    assert sum(padded_tokens(lengths, p) for p in fixed) > 1.8 * real  # long rows scattered over the micro-batches
    assert sum(padded_tokens(lengths, p) for p in sorted_parts) < 1.1 * real


def test_a_required_count_splits_the_costliest_micro_batches():
    lengths = _random_lengths(3, 64)
    free = sorted_partition(lengths, 1024)
    parts = sorted_partition(lengths, 1024, num_parts=len(free) + 3)
    assert len(parts) == len(free) + 3
    assert sorted(i for p in parts for i in p) == list(range(64))
    assert all(padded_tokens(lengths, p) <= 1024 for p in parts)
    assert sorted_partition([4, 4], 100, num_parts=2) == [[0], [1]]


@pytest.mark.parametrize(
    ("lengths", "budget", "parts", "message"),
    [
        ([], 10, None, "no rows"),
        ([3, 0], 10, None, "must be >= 1"),
        ([3, 3], 0, None, "must be >= 1"),
        ([3, 3], 10, 3, "cannot split 2 rows into 3 micro-batches"),
        ([5, 5, 5], 5, 2, r"the budget needs 3"),
    ],
)
def test_bad_input_is_an_error(lengths, budget, parts, message):
    with pytest.raises(ValueError, match=message):
        sorted_partition(lengths, budget, num_parts=parts)


def _nested_batch(lengths: list[int], use_remove_padding: bool):
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    ids = [torch.arange(n) + 10 * i for i, n in enumerate(lengths)]
    batch = TensorDict(
        {
            "input_ids": torch.nested.as_nested_tensor(ids, layout=torch.jagged),
            "row": torch.arange(len(lengths)),
        },
        batch_size=len(lengths),
    )
    tu.assign_non_tensor(batch, use_remove_padding=use_remove_padding)
    return batch


def test_shim_sorts_padded_rows_and_verl_restores_their_order():
    from verl.utils.seqlen_balancing import restore_dynamic_batch
    from verl.workers.engine import utils as engine_utils

    from verl_gigpo.verl_glue.cpu.shims import length_sorted_micro_batches

    original = engine_utils.rearrange_micro_batches
    length_sorted_micro_batches()
    try:
        lengths = _random_lengths(1, 48)
        batch = _nested_batch(lengths, use_remove_padding=False)
        micro, indices = engine_utils.rearrange_micro_batches(batch, max_token_len=512)
        assert indices == sorted_partition(lengths, 512)
        assert [mb["row"].tolist() for mb in micro] == indices  # the rows verl will forward, in these groups
        outputs = torch.nested.as_nested_tensor(
            [t for mb in micro for t in mb["input_ids"].unbind()], layout=torch.jagged
        )
        restored = restore_dynamic_batch(outputs, indices)  # what verl's postprocess_batch_func does
        for i, row in enumerate(restored.unbind()):
            assert torch.equal(row, torch.arange(lengths[i]) + 10 * i)
        # packed rows keep verl's token-balanced split (its cost is the sum of lengths, not rows x longest)
        packed = _nested_batch(lengths, use_remove_padding=True)
        assert engine_utils.rearrange_micro_batches(packed, max_token_len=512)[1] == original(packed, 512)[1]
        length_sorted_micro_batches()  # idempotent
        assert engine_utils.rearrange_micro_batches.__wrapped__ is original
    finally:
        engine_utils.rearrange_micro_batches = original


def test_parts_equal_verls_row_selection_without_the_row_objects_no_pass_reads():
    from tensordict import NonTensorData, NonTensorStack
    from verl.utils import tensordict_utils as tu

    from verl_gigpo.verl_glue.cpu.shims import MICRO_BATCH_ROW_OBJECTS, _select_parts

    lengths = _random_lengths(2, 40)
    batch = _nested_batch(lengths, use_remove_padding=False)
    batch["extra_fields"] = NonTensorStack(*[NonTensorData({"row": i}) for i in range(40)])
    batch["multi_modal_inputs"] = NonTensorStack(*[NonTensorData({"image": i}) for i in range(40)])
    parts = sorted_partition(lengths, 256)
    for mine, part in zip(_select_parts(batch, parts), parts, strict=True):
        verls = tu.index_select_tensor_dict(batch, part)
        assert set(verls.keys()) - set(mine.keys()) == {"extra_fields"}  # read by no forward pass or loss
        assert "multi_modal_inputs" in MICRO_BATCH_ROW_OBJECTS and mine.batch_size == verls.batch_size
        for a, b in zip(mine["input_ids"].unbind(), verls["input_ids"].unbind(), strict=True):
            assert torch.equal(a, b)
        assert torch.equal(mine["row"], verls["row"])
        assert list(mine["multi_modal_inputs"]) == list(verls["multi_modal_inputs"]) == [{"image": i} for i in part]
        assert tu.get_non_tensor_data(mine, "use_remove_padding", None) is False
