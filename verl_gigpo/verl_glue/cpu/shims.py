"""The few changes to verl internals that running verl 0.9.1 on a CPU needs where verl offers no extension point.

Everything else of the CPU path goes through verl's own registries (the ``cpu`` platform, the FSDP engine
registered for device ``cpu``, the ``hf`` rollout backend). Each shim below names the verl symbol it works around
and is applied only in processes that run on the CPU platform (``VERL_PLATFORM=cpu``), when verl imports the module
it changes (:func:`verl_gigpo.verl_glue.cpu.register_cpu_backends`); each is idempotent. When installed, each checks the
verl version and that what it replaces is what it was written for (parameters, and the object each importing module
bound), and raises :class:`verl_gigpo.verl_glue.verl_version.VerlMismatchError` otherwise, rather than silently not
applying (:mod:`verl_gigpo.verl_glue.verl_version`). Nothing here changes verl's behaviour on GPUs. The one shim every
platform gets (verl's file logger appends across the launches of ``python -m verl_gigpo.main``) lives with the metrics
file it serves: :func:`verl_gigpo.verl_glue.metrics_file.append_file_logger`.
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
    """verl's ``verl.utils.distributed.initialize_global_process_group_ray`` builds the backend
    ``f"cpu:gloo,{device}:{backend}"``, which on the CPU platform is ``"cpu:gloo,cpu:gloo"``, and torch rejects a
    duplicate device type. Default the backend to plain ``gloo``.

    The modules of :data:`GLOO_BOUND_BY` bind the function by name at import, so their bindings are checked and
    replaced too: a loaded module now; a module not imported yet when it is imported (it binds the patched function);
    a module whose import is under way (it is importing ``verl.utils.distributed``, which runs this shim) at the
    patched function's first call, when its import has finished.

    Raises:
        VerlMismatchError: the function's parameters are not ``(timeout_second, backend)``, or a module of
            :data:`GLOO_BOUND_BY` binds something else under that name (or nothing).
    """
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
    """verl's ``FSDPEngine._build_fsdp_module`` (``verl.workers.engine.fsdp.transformer_impl``) gives forward-only
    engines (the reference policy) ``CPUOffloadPolicy(pin_memory=True)``; pinned host memory needs an accelerator
    ("Cannot access accelerator device"). On the CPU the parameters already live in host memory, so the same policy
    without pinning is used.

    Raises:
        VerlMismatchError: ``transformer_impl.CPUOffloadPolicy`` is not ``verl.utils.fsdp_utils.CPUOffloadPolicy``
            (torch's), or it takes no ``pin_memory``.
    """
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
    """verl's dynamic micro-batch split (``use_dynamic_bsz``: ``verl.utils.seqlen_balancing.rearrange_micro_batches``,
    called by ``verl.workers.engine.utils.prepare_micro_batches``) balances the total tokens of the micro-batches
    (Karmarkar-Karp, ``seqlen_balancing.get_seqlen_balanced_partitions``), so each mixes short and long rows; with
    padded inputs (``use_remove_padding=false``, the CPU platform's setting) every row then pays for the longest of its
    micro-batch. For padded inputs the split becomes :func:`verl_gigpo.verl_glue.cpu.micro_batches.sorted_partition`:
    rows of similar length together, at most ``max_token_len`` PADDED tokens per micro-batch (a longer row alone), the
    same number of micro-batches on every data-parallel rank. verl restores the rows' order from the returned indices
    (``restore_dynamic_batch``), and its losses are normalised by the whole mini-batch's tokens or rows
    (``agg_loss``), so log-probs and gradients are the same up to float rounding; only per-micro-batch metric
    means are averaged over other groups. The micro-batches carry the tensors, the batch-wide settings and, of the
    per-row Python objects, only :data:`MICRO_BATCH_ROW_OBJECTS` (:func:`_select_parts`). Packed inputs
    (``use_remove_padding=true``) and grouped rows (``force_group_size > 1``) keep verl's split.

    ``verl.workers.engine.utils`` binds the function by name at import, so that binding is replaced.

    Raises:
        VerlMismatchError: that binding is not ``verl.utils.seqlen_balancing.rearrange_micro_batches``, or its
            parameters are not the ones this replacement takes.
    """
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
    """``[tu.index_select_tensor_dict(batch, part) for part in parts]`` with the same per-field rules
    (``verl.utils.tensordict_utils.index_select_tensor_dict``), but each nested field is unbound once for all parts
    instead of once per part (that costs ~40 ms per micro-batch for 300 rows of 7 nested fields), and of the per-row
    Python objects only :data:`MICRO_BATCH_ROW_OBJECTS` are kept."""
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
