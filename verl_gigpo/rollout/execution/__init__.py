"""Where and how long environment calls may run: the ``env.step_timeout_s``, ``env.reset_timeout_s`` and
``env.num_workers`` keys, read by one validator for both engines, and the error a missed deadline raises.
The package runs environment calls: :mod:`.envcalls` (one episode's calls, each under its deadline), :mod:`.threads`
(the thread pool), :mod:`.pool` (reused environments), :mod:`.procpool` with :mod:`.procworker` and :mod:`.wire`
(environments hosted in worker processes).

    execution = EnvExecution.from_config(cfg.env)          # raises ValueError naming e.g. env.step_timeout_s
    execution.step_timeout_s, execution.reset_timeout_s   # seconds, or None (no deadline)
    execution.resolve_workers(engine_processes=8)         # worker processes for non-thread-parallel environments

Deadlines (docs/environments-execution.md):

* ``step_timeout_s`` bounds one ``env.step`` (and the ``close`` of a broken environment);
* ``reset_timeout_s`` bounds building an environment (when the pool has no idle one) and one ``env.reset``.

The clock starts when the call starts running (in its thread, or in its worker process), not while it waits for
a free thread. A call in a thread also waits there for locks the environment takes (ALFWorld's engine lock is
held by the other episodes' calls in the same process), so the defaults leave room for that.
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

#: ``env.step_timeout_s`` default: ALFWorld steps take 20-80 ms; 60 s also covers waiting behind 128 other episodes'
#: steps for the engine lock of one process, or a slow remote WebShop / retrieval server.
DEFAULT_STEP_TIMEOUT_S = 60.0
#: ``env.reset_timeout_s`` default: building an ALFWorld instance and loading a real game takes ~0.5-3 s, and in
#: threads a reset also waits for every other episode's load under the engine lock (16 games' first loads back to
#: back at the start of an iteration: ~1 minute); 300 s leaves a factor of five.
DEFAULT_RESET_TIMEOUT_S = 300.0
#: ``env.num_workers: auto`` never starts more worker processes than this per engine process.
MAX_AUTO_WORKERS = 32


class EnvDeadlineError(EnvError):
    """An environment call gave no answer within its deadline; the episode fails and the instance is dropped.

    Attributes (besides :class:`~environments.EnvError`'s ``env_name``, ``task_id``, ``step``): ``call`` (``"make"``,
    ``"reset"``, ``"step"``, ``"close"``), ``waited_s`` (seconds the call ran), ``key`` (the deadline as set,
    e.g. ``"env.step_timeout_s=60 s"``) and ``remedy`` (what was done with the stuck call: thread abandoned,
    worker process replaced).
    """

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
    """How environment calls run (the ``env.*`` keys of this module).

    step_timeout_s: deadline of one ``step`` (and of closing a broken instance); None = wait for ever.
    reset_timeout_s: deadline of building an instance and of one ``reset``; None = wait for ever.
    num_workers: worker processes hosting environments whose class says ``thread_parallel = False`` (ALFWorld):
        ``"auto"`` (see :meth:`resolve_workers`), 0 (run them in threads of this process; their calls take turns)
        or a positive count. Environments that are thread-parallel always run in threads.
    """

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
        """The settings of an ``env`` config section (a missing key takes its default).

        Raises:
            ValueError: a value out of range; the message names the key as typed (``env.step_timeout_s``).
        """
        env = env if env is not None else {}
        return cls(
            step_timeout_s=_seconds(env.get("step_timeout_s", DEFAULT_STEP_TIMEOUT_S), "env.step_timeout_s"),
            reset_timeout_s=_seconds(env.get("reset_timeout_s", DEFAULT_RESET_TIMEOUT_S), "env.reset_timeout_s"),
            num_workers=env.get("num_workers", "auto"),
        )

    def resolve_workers(self, *, engine_processes: int = 1, cpus: int | None = None) -> int:
        """The number of worker processes: ``num_workers`` itself, or for ``"auto"`` the cores left to each of the
        ``engine_processes`` processes that run episodes on this machine (verl's agent-loop workers on this node;
        1 on the local engine): ``max(1, min(MAX_AUTO_WORKERS, cpus // engine_processes))``."""
        if self.num_workers != "auto":
            return int(self.num_workers)
        cpus = usable_cpus() if cpus is None else cpus
        return max(1, min(MAX_AUTO_WORKERS, cpus // max(1, engine_processes)))
