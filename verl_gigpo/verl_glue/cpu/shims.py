"""The few changes to verl internals that running verl 0.9.1 on a CPU needs where verl offers no extension point.

Each shim names the verl symbol it works around, is applied only in processes on the CPU platform when verl imports
the module it changes, is idempotent, and checks what it replaces (a ``VerlMismatchError`` otherwise). Nothing here
changes verl's behaviour on GPUs. Why each: docs/verl-integration.md ("The shims").
"""

from __future__ import annotations

import functools
import sys
from typing import Any

__all__ = [
    "GLOO_BOUND_BY",
    "MICRO_BATCH_ROW_OBJECTS",
    "gloo_process_group",
    "length_sorted_micro_batches",
    "unpinned_ref_offload",
]


#: the verl modules that bind ``initialize_global_process_group_ray`` by name at import
GLOO_BOUND_BY = ("verl.workers.engine_workers", "verl.checkpoint_engine.base")


def _check_version() -> None:
    from verl_gigpo.verl_glue.verl_version import check_verl_version, installed_verl_version

    check_verl_version(installed_verl_version())


def _already_installed(current: Any) -> bool:
    """Whether ``current`` is a shim's replacement already; when it is verl's own, the verl version is checked first."""
    if getattr(current, "_gigpo_cpu", False):
        return True
    _check_version()
    return False


def gloo_process_group() -> None:
    """Default the backend of verl's ``initialize_global_process_group_ray`` to plain ``gloo`` (verl's
    ``"cpu:gloo,cpu:gloo"`` is refused by torch), in every module of :data:`GLOO_BOUND_BY` that binds it.
    VerlMismatchError if its parameters are not ``(timeout_second, backend)`` or a module binds something else."""
    from verl.utils import distributed

    from verl_gigpo.verl_glue.contract import check_binding, check_signature
    from verl_gigpo.verl_glue.cpu import _when_imported

    original = distributed.initialize_global_process_group_ray
    if _already_installed(original):
        return
    use = "CPU platform's gloo shim (verl_gigpo.verl_glue.cpu.shims.gloo_process_group)"
    name = "initialize_global_process_group_ray"
    check_signature(original, ("timeout_second", "backend"), target=f"verl.utils.distributed.{name}", use=use)
    loaded, importing, later = [], [], []
    for module_name in GLOO_BOUND_BY:
        module = sys.modules.get(module_name)
        if module is None:
            later.append(module_name)
        elif getattr(getattr(module, "__spec__", None), "_initializing", False):
            importing.append(module_name)
        else:
            check_binding(module_name, name, original, use=use)
            loaded.append(module)

    @functools.wraps(original)
    def initialize_global_process_group_ray(timeout_second: Any = None, backend: Any = None) -> Any:
        while importing:
            check_binding(importing.pop(), name, initialize_global_process_group_ray, use=use)
        return original(timeout_second=timeout_second, backend=backend or "gloo")

    initialize_global_process_group_ray._gigpo_cpu = True  # type: ignore[attr-defined]
    distributed.initialize_global_process_group_ray = initialize_global_process_group_ray
    for module in loaded:
        setattr(module, name, initialize_global_process_group_ray)

    def check_bound(module: Any) -> None:
        check_binding(module.__name__, name, initialize_global_process_group_ray, use=use)

    for module_name in later:
        _when_imported(module_name, check_bound)


def unpinned_ref_offload() -> None:
    """Give verl's forward-only FSDP engines (the reference policy) ``CPUOffloadPolicy`` without pinned memory, which
    needs an accelerator. VerlMismatchError if verl's ``CPUOffloadPolicy`` is not torch's or takes no ``pin_memory``."""
    from verl.utils import fsdp_utils
    from verl.workers.engine.fsdp import transformer_impl

    from verl_gigpo.verl_glue.contract import check_binding, parameter_names
    from verl_gigpo.verl_glue.verl_version import VerlMismatchError

    policy = transformer_impl.CPUOffloadPolicy
    if _already_installed(policy):
        return
    use = "CPU platform's offload shim (verl_gigpo.verl_glue.cpu.shims.unpinned_ref_offload)"
    check_binding(transformer_impl.__name__, "CPUOffloadPolicy", fsdp_utils.CPUOffloadPolicy, use=use)
    if policy is None or "pin_memory" not in parameter_names(policy):
        raise VerlMismatchError(
            "verl.workers.engine.fsdp.transformer_impl.CPUOffloadPolicy",
            "torch's CPUOffloadPolicy, taking pin_memory",
            repr(policy),
            use=use,
        )

    class UnpinnedCPUOffloadPolicy(policy):  # type: ignore[misc, valid-type]
        """``CPUOffloadPolicy`` that never pins memory (the CPU platform has no accelerator to pin for)."""

        _gigpo_cpu = True

        def __init__(self, pin_memory: bool = False, **kwargs: Any) -> None:
            super().__init__(pin_memory=False, **kwargs)

    transformer_impl.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy


def length_sorted_micro_batches() -> None:
    """Replace verl's dynamic micro-batch split (``rearrange_micro_batches``, as bound in
    ``verl.workers.engine.utils``) for padded inputs by ``micro_batches.sorted_partition``:
    rows of similar length together; the same log-probs and gradients. VerlMismatchError if the binding or its
    parameters differ."""
    from verl.utils import seqlen_balancing
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine import utils as engine_utils

    from verl_gigpo.verl_glue.contract import check_binding, check_signature

    original = engine_utils.rearrange_micro_batches
    if _already_installed(original):
        return
    use = "CPU platform's micro-batch shim (verl_gigpo.verl_glue.cpu.shims.length_sorted_micro_batches)"
    check_binding(engine_utils.__name__, "rearrange_micro_batches", seqlen_balancing.rearrange_micro_batches, use=use)
    check_signature(original, REARRANGE_PARAMS, target="verl.utils.seqlen_balancing.rearrange_micro_batches", use=use)

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

        from verl_gigpo.verl_glue.cpu.micro_batches import sorted_partition

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


#: the parameters of verl's ``rearrange_micro_batches`` that :func:`length_sorted_micro_batches`'s replacement takes
REARRANGE_PARAMS = (
    "batch",
    "max_token_len",
    "dp_group",
    "num_batches_divided_by",
    "same_micro_num_in_dp",
    "min_num_micro_batch",
    "use_dynamic_bsz_balance",
    "force_group_size",
)

#: per-row Python objects (NonTensorStack fields) that verl's forward passes and losses read from a micro-batch
#: (``FSDPEngineWithLMHead.prepare_model_inputs``); the others (``extra_fields``, ``metrics``, the dataset's
#: columns, ...) are left out of the micro-batches: copying them (``micro_batch.to`` in
#: ``FSDPEngineWithLMHead.forward_step``) cost ~10-18% of a pass.
MICRO_BATCH_ROW_OBJECTS = ("multi_modal_inputs",)


def _select_parts(batch: Any, parts: list[list[int]]) -> list[Any]:
    """``[tu.index_select_tensor_dict(batch, part) for part in parts]``, each nested field unbound once for all parts
    and of the per-row objects only :data:`MICRO_BATCH_ROW_OBJECTS` kept."""
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
