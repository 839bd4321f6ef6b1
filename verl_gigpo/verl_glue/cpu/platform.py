"""verl's ``cpu`` platform: run verl's own pipeline (FSDP workers over gloo, Ray) on a machine with no accelerator.

Registered into verl's ``PlatformRegistry`` by the plug-in; selected with ``VERL_PLATFORM=cpu``, never
auto-detected. Ray gets logical GPUs for placement only (docs/verl-integration.md, "The cpu platform").
"""

from __future__ import annotations

from contextlib import contextmanager
from types import ModuleType
from typing import Any

from verl.plugin.platform import PlatformBase, PlatformRegistry

from verl_gigpo.verl_glue.contract import check_contract
from verl_gigpo.verl_glue.cpu import PLATFORM_NAME

__all__ = ["CPUPlatform", "register_cpu_platform"]


class CPUPlatform(PlatformBase):
    """verl platform for CPU-only machines (see the module docstring)."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        from verl_gigpo.verl_glue.cpu import device

        return device

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # never auto-detected: the CPU is "available" everywhere, and a GPU machine must keep its GPUs
        return False

    def current_device(self) -> Any:
        # verl passes this to tensor.to(...) and FSDP's device_id; an int would mean "accelerator 0"
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        import torch

        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        self.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray sets it for actors holding logical GPUs; nothing on the CPU path reads it
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def register_cpu_platform() -> None:
    """Register :class:`CPUPlatform` under ``"cpu"`` in verl's platform registry (idempotent)."""
    if PlatformRegistry.get(PLATFORM_NAME) is not CPUPlatform:
        PlatformRegistry.register(platform=PLATFORM_NAME)(CPUPlatform)


check_contract(__name__)  # PlatformRegistry.register, as verl 0.9.1 defines it
register_cpu_platform()  # importing this module is enough (see verl_gigpo.verl_glue.cpu.register_cpu_backends)
