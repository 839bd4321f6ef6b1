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

__all__ = ["gloo_process_group", "unpinned_ref_offload"]

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
