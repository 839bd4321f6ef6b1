"""The few changes to verl internals that running verl 0.9.1 on a CPU needs where verl offers no extension point.

Everything else of the CPU path goes through verl's own registries (the ``cpu`` platform, the FSDP engine
registered for device ``cpu``, the ``hf`` rollout backend). Each shim below names the verl file and line it works
around and is applied only in processes that run on the CPU platform (``VERL_PLATFORM=cpu``), when verl imports the
module it changes (:func:`verl_gigpo.cpu.register_cpu_backends`); each is idempotent. Nothing here changes verl's
behaviour on GPUs. The one shim every platform gets (verl's file logger appends across the launches of
``python -m verl_gigpo.main``) lives with the metrics file it serves:
:func:`verl_gigpo.metrics_file.append_file_logger`.
"""

from __future__ import annotations

import functools
import logging
import sys
from typing import Any

__all__ = ["MICRO_BATCH_ROW_OBJECTS", "gloo_process_group", "length_sorted_micro_batches", "unpinned_ref_offload"]

logger = logging.getLogger(__name__)


def gloo_process_group() -> None:
    """verl/utils/distributed.py:89 builds the backend ``f"cpu:gloo,{device}:{backend}"``, which on the CPU platform
    is ``"cpu:gloo,cpu:gloo"``, and torch rejects a duplicate device type. Default the backend to plain ``gloo``.

    Callers bound the function at import (verl/workers/engine_workers.py:38, verl/checkpoint_engine/base.py:25),
    so those bindings are replaced too when the modules are already loaded.
    """
    from verl.utils import distributed

    original = distributed.initialize_global_process_group_ray
    if getattr(original, "_gigpo_cpu", False):
        return

    @functools.wraps(original)
    def initialize_global_process_group_ray(timeout_second: Any = None, backend: Any = None) -> Any:
        return original(timeout_second=timeout_second, backend=backend or "gloo")

    initialize_global_process_group_ray._gigpo_cpu = True  # type: ignore[attr-defined]
    distributed.initialize_global_process_group_ray = initialize_global_process_group_ray
    for module_name in ("verl.workers.engine_workers", "verl.checkpoint_engine.base"):
        module = sys.modules.get(module_name)
        if module is not None and getattr(module, "initialize_global_process_group_ray", None) is original:
            module.initialize_global_process_group_ray = initialize_global_process_group_ray


def unpinned_ref_offload() -> None:
    """verl/workers/engine/fsdp/transformer_impl.py:462 gives forward-only engines (the reference policy)
    ``CPUOffloadPolicy(pin_memory=True)``; pinned host memory needs an accelerator ("Cannot access accelerator
    device"). On the CPU the parameters already live in host memory, so the same policy without pinning is used.
    """
    from verl.workers.engine.fsdp import transformer_impl

    policy = transformer_impl.CPUOffloadPolicy
    if getattr(policy, "_gigpo_cpu", False):
        return

    class UnpinnedCPUOffloadPolicy(policy):  # type: ignore[misc, valid-type]
        """``CPUOffloadPolicy`` that never pins memory (the CPU platform has no accelerator to pin for)."""

        _gigpo_cpu = True

        def __init__(self, pin_memory: bool = False, **kwargs: Any) -> None:
            super().__init__(pin_memory=False, **kwargs)

    transformer_impl.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy


def length_sorted_micro_batches() -> None:
    """verl's dynamic micro-batch split (``use_dynamic_bsz``: ``rearrange_micro_batches``,
    verl/utils/seqlen_balancing.py:348, called by verl/workers/engine/utils.py:112) balances the total tokens of
    the micro-batches (Karmarkar-Karp, seqlen_balancing.py:452), so each mixes short and long rows; with padded
    inputs (``use_remove_padding=false``, the CPU platform's setting) every row then pays for the longest of its
    micro-batch. For padded inputs the split becomes :func:`verl_gigpo.cpu.micro_batches.sorted_partition`: rows of
    similar length together, at most ``max_token_len`` PADDED tokens per micro-batch (a longer row alone), the same
    number of micro-batches on every data-parallel rank. verl restores the rows' order from the returned indices
    (``restore_dynamic_batch``), and its losses are normalised by the whole mini-batch's tokens or rows
    (``agg_loss``), so log-probs and gradients are the same up to float rounding; only per-micro-batch metric
    means are averaged over other groups. The micro-batches carry the tensors, the batch-wide settings and, of the
    per-row Python objects, only :data:`MICRO_BATCH_ROW_OBJECTS` (:func:`_select_parts`). Packed inputs
    (``use_remove_padding=true``) and grouped rows (``force_group_size > 1``) keep verl's split.

    The function is bound by name at import (verl/workers/engine/utils.py:28), so that binding is replaced.
    """
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine import utils as engine_utils

    original = engine_utils.rearrange_micro_batches
    if getattr(original, "_gigpo_cpu", False):
        return

    @functools.wraps(original)
    def rearrange_micro_batches(
        batch: Any,
        max_token_len: int,
        dp_group: Any = None,
        num_batches_divided_by: int | None = None,
        same_micro_num_in_dp: bool = True,
        min_num_micro_batch: int | None = None,
        use_dynamic_bsz_balance: bool = True,
        force_group_size: int = 1,
    ) -> tuple[list[Any], list[list[int]]]:
        input_ids = batch["input_ids"]
        packed = tu.get_non_tensor_data(data=batch, key="use_remove_padding", default=True)
        if packed or force_group_size != 1 or not input_ids.is_nested:
            return original(
                batch,
                max_token_len,
                dp_group=dp_group,
                num_batches_divided_by=num_batches_divided_by,
                same_micro_num_in_dp=same_micro_num_in_dp,
                min_num_micro_batch=min_num_micro_batch,
                use_dynamic_bsz_balance=use_dynamic_bsz_balance,
                force_group_size=force_group_size,
            )
        import torch
        from torch import distributed as dist

        from verl_gigpo.cpu.micro_batches import sorted_partition

        lengths = input_ids.offsets().diff().tolist()  # (N,) tokens per row
        count = max(len(sorted_partition(lengths, max_token_len)), min_num_micro_batch or 1)
        if dist.is_initialized() and same_micro_num_in_dp and dp_group is not None:
            agreed = torch.tensor([count], dtype=torch.long)
            dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=dp_group)
            count = int(agreed.item())
        if num_batches_divided_by:
            count = -(-count // num_batches_divided_by) * num_batches_divided_by
        parts = sorted_partition(lengths, max_token_len, num_parts=count)
        return _select_parts(batch, parts), parts

    rearrange_micro_batches._gigpo_cpu = True  # type: ignore[attr-defined]
    engine_utils.rearrange_micro_batches = rearrange_micro_batches


#: per-row Python objects (NonTensorStack fields) that verl's forward passes and losses read from a micro-batch
#: (verl/workers/engine/fsdp/transformer_impl.py:1168); the others (``extra_fields``, ``metrics``, the dataset's
#: columns, ...) are left out of the micro-batches: copying them (``micro_batch.to``, transformer_impl.py:1552)
#: cost ~10-18% of a pass.
MICRO_BATCH_ROW_OBJECTS = ("multi_modal_inputs",)


def _select_parts(batch: Any, parts: list[list[int]]) -> list[Any]:
    """``[tu.index_select_tensor_dict(batch, part) for part in parts]`` with the same per-field rules
    (verl/utils/tensordict_utils.py:458), but each nested field is unbound once for all parts instead of once per
    part (that costs ~40 ms per micro-batch for 300 rows of 7 nested fields), and of the per-row Python objects only
    :data:`MICRO_BATCH_ROW_OBJECTS` are kept."""
    import torch
    from tensordict import NonTensorStack, TensorDict
    from verl.utils.tensordict_utils import nested_tensor_from_tensor_list

    indices = [torch.tensor(part) for part in parts]
    fields: list[dict[str, Any]] = [{} for _ in parts]
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.is_nested:
            rows = value.unbind()
            ragged_idx = getattr(value, "_ragged_idx", value.dim() - 1)
            for out, part in zip(fields, parts, strict=True):
                out[key] = nested_tensor_from_tensor_list([rows[i] for i in part], ragged_idx=ragged_idx)
        elif isinstance(value, NonTensorStack) and key not in MICRO_BATCH_ROW_OBJECTS:
            continue  # per-row Python objects that no forward pass or loss reads
        elif isinstance(value, torch.Tensor) or value.shape:  # dense tensors, per-row objects, batch-wide data
            for out, index in zip(fields, indices, strict=True):
                out[key] = value[index]
        else:  # NonTensorData: batch-wide metadata
            for out in fields:
                out[key] = value
    return [TensorDict(source=out, batch_size=len(part)) for out, part in zip(fields, parts, strict=True)]
