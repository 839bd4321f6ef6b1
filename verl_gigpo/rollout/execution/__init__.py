"""Where and how long environment calls may run: the ``env.step_timeout_s``, ``env.reset_timeout_s`` and
``env.num_workers`` keys, read by one validator for both engines, and the error a missed deadline raises.
The package runs environment calls: :mod:`.envcalls` (one episode's calls, each under its deadline), :mod:`.threads`
(the thread pool), :mod:`.pool` (reused environments), :mod:`.procpool` with :mod:`.procworker` and :mod:`.wire`
(environments hosted in worker processes).

    execution = EnvExecution.from_config(cfg.env)          # raises ValueError naming e.g. env.step_timeout_s
    execution.step_timeout_s, execution.reset_timeout_s   # seconds, or None (no deadline)
    execution.resolve_workers(engine_processes=8)         # worker processes for non-thread-parallel environments

The keys, their defaults and where the clock starts: docs/environments-execution.md.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from environments import EnvError
from verl_gigpo.config.rules import Range

__all__ = [
    "DEFAULT_RESET_TIMEOUT_S",
    "DEFAULT_STEP_TIMEOUT_S",
    "MAX_AUTO_WORKERS",
    "EnvDeadlineError",
    "EnvExecution",
    "usable_cpus",
]

#: ``env.step_timeout_s`` and ``env.reset_timeout_s`` defaults (why: docs/environments-execution.md#keys)
DEFAULT_STEP_TIMEOUT_S = 60.0
DEFAULT_RESET_TIMEOUT_S = 300.0
#: ``env.num_workers: auto`` never starts more worker processes than this per engine process.
MAX_AUTO_WORKERS = 32


class EnvDeadlineError(EnvError):
    """An environment call gave no answer within its deadline (``key``, e.g. ``"env.step_timeout_s=60 s"``); the
    episode fails, the instance is dropped, and ``remedy`` says what was done with the stuck call."""

    def __init__(
        self, env_name: str, task_id: str | None, step: int, *, call: str, waited_s: float, key: str, remedy: str
    ):
        self.call, self.waited_s, self.key, self.remedy = call, waited_s, key, remedy
        message = f"{call}() gave no answer within {key} (waited {waited_s:.1f} s); {remedy}"
        super().__init__(env_name, task_id, step, message)


def usable_cpus() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one, else ``os.cpu_count()``)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _seconds(value: Any, key: str) -> float | None:
    """A deadline in seconds: a finite number > 0, or None (null) for no deadline; ``ValueError`` names ``key``."""
    Range(key, "float", "a deadline in seconds; null = no deadline", low=0, low_open=True, nullable=True).check(value)
    return None if value is None else float(value)


@dataclass(frozen=True)
class EnvExecution:
    """How environment calls run: ``env.step_timeout_s``, ``env.reset_timeout_s`` (None: no deadline) and
    ``env.num_workers`` (docs/environments-execution.md#keys)."""

    step_timeout_s: float | None = DEFAULT_STEP_TIMEOUT_S
    reset_timeout_s: float | None = DEFAULT_RESET_TIMEOUT_S
    num_workers: int | str = "auto"

    def __post_init__(self) -> None:
        _seconds(self.step_timeout_s, "env.step_timeout_s")
        _seconds(self.reset_timeout_s, "env.reset_timeout_s")
        workers = self.num_workers
        if workers != "auto":
            meaning = "or 'auto'; 0 = environments in threads, N = that many worker processes"
            Range("env.num_workers", "int", meaning, low=0).check(workers)

    @classmethod
    def from_config(cls, env: Mapping[str, Any] | None) -> EnvExecution:
        """The settings of an ``env`` section (missing keys: defaults); ValueError names the bad key."""
        env = env if env is not None else {}
        return cls(
            step_timeout_s=_seconds(env.get("step_timeout_s", DEFAULT_STEP_TIMEOUT_S), "env.step_timeout_s"),
            reset_timeout_s=_seconds(env.get("reset_timeout_s", DEFAULT_RESET_TIMEOUT_S), "env.reset_timeout_s"),
            num_workers=env.get("num_workers", "auto"),
        )

    def resolve_workers(self, *, engine_processes: int = 1, cpus: int | None = None) -> int:
        """``num_workers``, or for ``"auto"``: ``max(1, min(MAX_AUTO_WORKERS, cpus // engine_processes))``."""
        if self.num_workers != "auto":
            return int(self.num_workers)
        cpus = usable_cpus() if cpus is None else cpus
        return max(1, min(MAX_AUTO_WORKERS, cpus // max(1, engine_processes)))
