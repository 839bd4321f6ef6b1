"""The environment calls of one episode, each under its deadline: what :func:`verl_gigpo.rollout.run_episode`
awaits instead of calling an environment directly.

    calls = EnvCalls(task, config, episode, execution=EnvExecution(), threads=pool_of_threads, env_pool=env_pool)
    env = await calls.acquire()                        # from the pool (or the factory), under env.reset_timeout_s
    observation, info = await calls.reset(env)         # under env.reset_timeout_s
    observation, reward, terminated, truncated, info = await calls.step(env, action)   # under env.step_timeout_s
    await calls.finish(env, broken=episode.env_error is not None)

A call runs in a worker process, a thread, or inline; a missed deadline raises
:class:`~verl_gigpo.rollout.execution.EnvDeadlineError`. Where calls run and what a missed deadline does:
docs/environments-execution.md.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

from environments import TextEnv
from verl_gigpo.rollout.execution import EnvDeadlineError, EnvExecution
from verl_gigpo.rollout.execution.pool import EnvPool
from verl_gigpo.rollout.execution.procpool import RemoteEnv
from verl_gigpo.rollout.execution.threads import CallAbandoned, EnvCallFuture, EnvThreadPool, TurnLock
from verl_gigpo.rollout.factory import make_task_env
from verl_gigpo.rollout.types import Episode, EpisodeConfig, TaskSpec

__all__ = ["EnvCalls", "default_threads"]

logger = logging.getLogger(__name__)

_DEFAULT_THREADS: EnvThreadPool | None = None
#: one first-come-first-served turn per environment class that is not thread-parallel, in this process
_TURNS: dict[type, TurnLock] = {}
_TURNS_LOCK = threading.Lock()


def default_threads() -> EnvThreadPool:
    """The process-wide thread pool of environment calls when the caller names none (64 threads)."""
    global _DEFAULT_THREADS
    if _DEFAULT_THREADS is None:
        _DEFAULT_THREADS = EnvThreadPool(64)
    return _DEFAULT_THREADS


def _close_quietly(env: Any) -> None:
    """Close an environment whose stuck call finally returned (in that call's thread); errors are logged."""
    try:
        env.close()
    except Exception:  # noqa: BLE001 - a late close of a written-off instance: nothing to hand the error to
        logger.warning("closing an abandoned environment failed", exc_info=True)


class EnvCalls:
    """The environment calls of one episode of ``task``; adds each call's seconds to ``episode.timing["env"]``.
    Without ``env_pool``, ``factory`` builds an environment per episode."""

    def __init__(
        self,
        task: TaskSpec,
        config: EpisodeConfig,
        episode: Episode,
        *,
        execution: EnvExecution,
        threads: EnvThreadPool | None = None,
        env_pool: EnvPool | None = None,
        factory: Callable[[TaskSpec, EpisodeConfig], TextEnv] = make_task_env,
    ):
        self.task, self.config, self.episode = task, config, episode
        self.execution = execution
        self.threads = threads if threads is not None else default_threads()
        self.env_pool, self.factory = env_pool, factory
        self.stuck = False  # an instance whose call was abandoned or whose worker was killed: never reused
        self.task_id: str | None = None

    # ------------------------------------------------------------------ the calls
    async def acquire(self) -> TextEnv:
        """An environment for the task: from the pool (a worker process for hosted kinds) or the factory."""
        pool, timeout = self.env_pool, self.execution.reset_timeout_s
        if pool is not None and pool.in_process(self.task):
            env, seconds = await self._remote(pool.acquire_remote(self.task, self.config))
            self.episode.timing["env"] += seconds
            return env
        if pool is not None:
            return await self._threaded("make", timeout, 0, pool.acquire, self.task, self.config)
        return await self._threaded("make", timeout, 0, self.factory, self.task, self.config)

    async def reset(self, env: TextEnv) -> tuple[str, dict[str, Any]]:
        """``env.reset`` with the task's seed and split; records the task id for later messages."""
        options = {"split": self.task.split}
        if isinstance(env, RemoteEnv):
            (observation, info), seconds = await self._remote(env._host.call(env, "reset", (self.task.seed, options)))
            self.episode.timing["env"] += seconds
        else:
            observation, info = await self._threaded(
                "reset", self.execution.reset_timeout_s, 0, _reset, env, self.task.seed, options, env=env
            )
        self.task_id = info.get("task_id")
        return observation, info

    async def step(self, env: TextEnv, action: str | None, step_id: int) -> tuple[str, float, bool, bool, dict]:
        """``env.step(action)``; ``step_id`` (0-based) names the step in a deadline message (as step ``step_id+1``,
        the count ``EnvError`` uses)."""
        if isinstance(env, RemoteEnv):
            value, seconds = await self._remote(env._host.call(env, "step", (action,)))
            self.episode.timing["env"] += seconds
            return value
        return await self._threaded("step", self.execution.step_timeout_s, step_id + 1, env.step, action, env=env)

    async def finish(self, env: TextEnv, *, broken: bool) -> None:
        """Give ``env`` back (kept for reuse unless ``broken``) or close it; nothing for an instance whose call was
        abandoned. A close that misses ``env.step_timeout_s`` is abandoned with a warning; the episode keeps its
        result."""
        if self.stuck:
            return
        if isinstance(env, RemoteEnv):
            self.env_pool.release(self.task, self.config, env, broken)  # does not wait
            return
        timeout = self.execution.step_timeout_s
        try:
            if self.env_pool is not None:
                release = self.env_pool.release
                await self._threaded("close", timeout, 0, release, self.task, self.config, env, broken, env=env)
            else:
                await self._threaded("close", timeout, 0, env.close, env=env)
        except EnvDeadlineError as exc:
            logger.warning("episode %s: %s", self.episode.traj_id, exc)

    # ------------------------------------------------------------------ how
    async def _remote(self, future: Any) -> Any:
        """Await a worker-process future (``(value, seconds)``). The host enforces the deadline; an instance whose
        worker was killed or died is only forgotten on release (``RemoteEnv.alive`` is False)."""
        try:
            return await asyncio.wrap_future(future)
        except EnvDeadlineError as exc:
            self.episode.timing["env"] += exc.waited_s
            raise

    async def _threaded(
        self, call: str, timeout: float | None, step: int, fn: Callable[..., Any], *args: Any, env: Any = None
    ) -> Any:
        """Run ``fn(*args)`` in the thread pool under ``timeout``; ``env`` (when known) is the instance to close if
        an abandoned call ever returns (for ``make``, the call's own result is)."""
        pool = self.threads
        if pool.inline:
            try:
                future = pool.call_inline(fn, args, timeout)
            except CallAbandoned as abandoned:
                raise self._abandoned(call, abandoned.future, abandoned.waited_s, timeout, step, env) from None
            self.episode.timing["env"] += future.elapsed_s
            return future.result()
        future = pool.submit(fn, *args, turn=self._turn(env))
        waiter = asyncio.wrap_future(future)
        while True:
            remaining = None if timeout is None else max(timeout - future.running_for(), 0.0)
            done, _ = await asyncio.wait({waiter}, timeout=remaining)
            if done:
                self.episode.timing["env"] += future.elapsed_s
                return waiter.result()
            waited = future.running_for()
            if future.started_at is not None and waited >= timeout and pool.abandon(future):
                waiter.cancel()  # the thread's late result goes nowhere
                raise self._abandoned(call, future, waited, timeout, step, env)

    def _turn(self, env: Any) -> TurnLock | None:
        """The first-come-first-served turn calls of ``env`` take when its class is not thread-parallel (their waits
        for its process-wide lock then do not count toward their deadlines;
        :mod:`verl_gigpo.rollout.execution.threads`)."""
        if env is None or getattr(type(env), "thread_parallel", True):
            return None
        with _TURNS_LOCK:
            return _TURNS.setdefault(type(env), TurnLock())

    def _abandoned(
        self, call: str, future: EnvCallFuture, waited: float, timeout: float, step: int, env: Any
    ) -> EnvDeadlineError:
        """Bookkeeping of an abandoned call; returns the error to raise."""
        self.stuck = True
        self.episode.abandoned_threads += 1
        self.episode.timing["env"] += waited
        key = "env.reset_timeout_s" if call in ("make", "reset") else "env.step_timeout_s"
        if env is not None:
            future.add_done_callback(lambda _: _close_quietly(env))
        elif call == "make":
            future.add_done_callback(lambda f: None if f.exception() else _close_quietly(f.result()))
        return EnvDeadlineError(
            self.task.env_name,
            self.task_id or f"seed={self.task.seed} split={self.task.split}",
            step,
            call=call,
            waited_s=waited,
            key=f"{key}={timeout:g} s",
            remedy=(
                f"the instance is dropped and its thread abandoned ({self.threads.abandoned_running} abandoned "
                "environment thread(s) still running in this process)"
            ),
        )


def _reset(env: TextEnv, seed: int, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return env.reset(seed=seed, options=options)
