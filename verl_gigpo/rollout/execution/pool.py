"""Reuse environment instances across episodes.

:class:`EnvPool` keeps finished environments per (name, kwargs, max_steps, key_mode) and hands them to the next
episode of the same kind (``reset`` re-initialises an environment that follows the contract); thread-safe.
Environments with ``thread_parallel = False`` go to a worker-process host when ``num_workers`` > 0
(docs/environments-execution.md).
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from collections.abc import Callable, Hashable
from concurrent.futures import Future

from environments import TextEnv, env_class
from verl_gigpo.rollout.execution import EnvExecution
from verl_gigpo.rollout.execution.procpool import ProcessEnvHost, RemoteEnv
from verl_gigpo.rollout.factory import make_task_env
from verl_gigpo.rollout.types import EpisodeConfig, TaskSpec

__all__ = ["EnvPool"]


class EnvPool:
    """A pool of idle environments keyed by what makes them interchangeable; ``max_idle`` kept per key.
    ``num_workers`` > 0 hosts non-thread-parallel environments in worker processes under ``execution``'s deadlines."""

    def __init__(
        self,
        factory: Callable[[TaskSpec, EpisodeConfig], TextEnv] | None = None,
        max_idle: int = 256,
        *,
        num_workers: int = 0,
        execution: EnvExecution | None = None,
    ):
        if max_idle < 0:
            raise ValueError(f"max_idle must be >= 0, got {max_idle}")
        self.factory = factory if factory is not None else make_task_env
        self.max_idle = max_idle
        self._idle: dict[Hashable, list[TextEnv]] = defaultdict(list)
        self._lock = threading.Lock()
        self.created = 0
        self.reused = 0
        self.host = ProcessEnvHost(num_workers, execution) if num_workers > 0 and factory is None else None
        self._in_process: dict[str, bool] = {}

    def in_process(self, task: TaskSpec) -> bool:
        """Whether ``task``'s environment is hosted in a worker process (a host exists and its class says
        ``thread_parallel = False``). An unknown name gives False: building it in a thread raises the registry's
        error."""
        if self.host is None:
            return False
        if task.env_name not in self._in_process:
            try:
                parallel = env_class(task.env_name).thread_parallel
            except (ValueError, ImportError):
                return False
            self._in_process[task.env_name] = not parallel
        return self._in_process[task.env_name]

    def acquire_remote(self, task: TaskSpec, config: EpisodeConfig) -> Future:
        """For a task with :meth:`in_process`: a future of ``(RemoteEnv, seconds)`` from the worker processes."""
        assert self.host is not None
        return self.host.acquire(task, config, self.key(task, config))

    @staticmethod
    def key(task: TaskSpec, config: EpisodeConfig) -> Hashable:
        """Environments built for tasks with equal keys are interchangeable (only the seed/split differ)."""
        kwargs = json.dumps(dict(task.env_kwargs), sort_keys=True, default=repr)
        return (task.env_name, kwargs, config.max_steps, config.key_mode, config.parse)

    def acquire(self, task: TaskSpec, config: EpisodeConfig) -> TextEnv:
        """An idle environment for ``task`` if there is one, else a new one (the caller resets it). Blocks while a
        worker process builds a hosted one."""
        if self.in_process(task):
            return self.acquire_remote(task, config).result()[0]
        key = self.key(task, config)
        with self._lock:
            if self._idle[key]:
                self.reused += 1
                return self._idle[key].pop()
            self.created += 1
        return self.factory(task, config)

    def release(self, task: TaskSpec, config: EpisodeConfig, env: TextEnv, broken: bool = False) -> None:
        """Give ``env`` back after an episode; a ``broken`` one (it raised) is closed instead of reused."""
        if isinstance(env, RemoteEnv):
            self.host.release(env, broken)
            return
        key = self.key(task, config)
        with self._lock:
            if not broken and len(self._idle[key]) < self.max_idle:
                self._idle[key].append(env)
                return
        env.close()

    def close(self) -> None:
        """Close every idle environment and end the worker processes."""
        with self._lock:
            envs = [env for group in self._idle.values() for env in group]
            self._idle.clear()
        for env in envs:
            env.close()
        if self.host is not None:
            self.host.close()

    def __len__(self) -> int:
        with self._lock:
            return sum(len(group) for group in self._idle.values())
