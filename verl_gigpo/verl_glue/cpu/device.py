"""The ``torch.<device>``-like module verl's CPU platform hands out (``get_torch_device()``): no-op caches and
synchronisation, psutil memory figures, torch's CPU generator for RNG state."""

from __future__ import annotations

import psutil
import torch

__all__ = [
    "Event",
    "Stream",
    "current_device",
    "current_stream",
    "device_count",
    "empty_cache",
    "get_device_name",
    "get_rng_state",
    "ipc_collect",
    "is_available",
    "manual_seed",
    "manual_seed_all",
    "max_memory_allocated",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_reserved",
    "reset_peak_memory_stats",
    "set_device",
    "set_per_process_memory_fraction",
    "set_rng_state",
    "stream",
    "synchronize",
]

Stream = torch.cpu.Stream
Event = torch.cpu.Event
stream = torch.cpu.stream
current_stream = torch.cpu.current_stream


def is_available() -> bool:
    """The CPU is always there."""
    return True


def device_count() -> int:
    """One CPU device per process (verl places one worker per logical device)."""
    return 1


def current_device() -> str:
    """``"cpu"``: usable wherever verl passes the result to ``tensor.to(...)`` or ``device_id=``."""
    return "cpu"


def set_device(device: object) -> None:
    """No-op: there is one CPU device."""


def get_device_name(device: object = None) -> str:
    """A readable name for logs."""
    return "cpu"


def synchronize(device: object = None) -> None:
    """No-op: CPU ops are synchronous."""


def empty_cache() -> None:
    """No-op: the CPU allocator keeps no cache verl could release."""


def ipc_collect() -> None:
    """No-op (CUDA IPC only)."""


def set_per_process_memory_fraction(fraction: float, device: object = None) -> None:
    """No-op: CPU memory is not partitioned per process."""


def _rss() -> int:
    return int(psutil.Process().memory_info().rss)


def memory_allocated(device: object = None) -> int:
    """Resident memory of this process in bytes (the closest CPU analogue of allocated device memory)."""
    return _rss()


def memory_reserved(device: object = None) -> int:
    """Same as :func:`memory_allocated` (no caching allocator on CPU)."""
    return _rss()


def max_memory_allocated(device: object = None) -> int:
    """Peak resident memory of this process in bytes (``ru_maxrss``), else the current one."""
    try:
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB
    except (ImportError, OSError):
        return _rss()


def max_memory_reserved(device: object = None) -> int:
    """Same as :func:`max_memory_allocated`."""
    return max_memory_allocated(device)


def reset_peak_memory_stats(device: object = None) -> None:
    """No-op: the OS peak cannot be reset."""


def mem_get_info(device: object = None) -> tuple[int, int]:
    """``(free, total)`` machine memory in bytes, as ``torch.cuda.mem_get_info`` returns for a GPU."""
    vm = psutil.virtual_memory()
    return int(vm.available), int(vm.total)


def get_rng_state(device: object = None) -> torch.Tensor:
    """torch's CPU RNG state (a uint8 tensor)."""
    return torch.get_rng_state()


def set_rng_state(state: torch.Tensor, device: object = None) -> None:
    """Restore torch's CPU RNG state."""
    torch.set_rng_state(state)


def manual_seed(seed: int) -> None:
    """Seed torch's CPU RNG."""
    torch.manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    """Seed torch's CPU RNG (there is one device)."""
    torch.manual_seed(seed)
