"""Threads for environment calls that survive calls which never return.

    pool = EnvThreadPool(64)
    future = pool.submit(env.step, action)        # an EnvCallFuture: started_at / elapsed_s set by the thread
    ...
    if not future.done() and pool.abandon(future): ...   # written off; pool.abandoned_running counts it

A call past its deadline is abandoned: its daemon thread is written off and a fresh one takes its place.
``threads=0`` runs calls inline (:meth:`EnvThreadPool.call_inline`); ``submit(..., turn=TurnLock)`` gives calls of a
non-thread-parallel environment first-come-first-served turns. Why: docs/environments-execution.md.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

from verl_gigpo.config.rules import Range

__all__ = ["CallAbandoned", "EnvCallFuture", "EnvThreadPool", "TurnLock"]


class CallAbandoned(Exception):
    """An inline call missed its deadline and was abandoned (:meth:`EnvThreadPool.call_inline`)."""

    def __init__(self, future: EnvCallFuture, waited_s: float):
        self.future, self.waited_s = future, waited_s
        super().__init__(f"abandoned after {waited_s:.1f} s")


class TurnLock:
    """A first-come-first-served lock whose turn can be passed on for a holder that never returns
    (:meth:`EnvThreadPool.abandon`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: deque[threading.Event] = deque()
        self._held = False

    def acquire(self) -> None:
        """Wait for the turn (in arrival order)."""
        with self._lock:
            if not self._held:
                self._held = True
                return
            turn = threading.Event()
            self._waiting.append(turn)
        turn.wait()  # handed over by release(): held from here

    def release(self) -> None:
        """Hand the turn to the longest waiter, or free it."""
        with self._lock:
            if self._waiting:
                self._waiting.popleft().set()
            else:
                self._held = False


class EnvCallFuture(Future):
    """A :class:`~concurrent.futures.Future` that knows when its call started (``started_at``, ``perf_counter``
    seconds, None while queued), how long it ran (``elapsed_s``, once finished) and whether it was abandoned."""

    def __init__(self, fn: Callable[..., Any], args: tuple, kwargs: dict):
        super().__init__()
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.started_at: float | None = None
        self.elapsed_s = 0.0
        self.abandoned = False
        self.turn: TurnLock | None = None  # taken before the call starts, given back (once) after it
        self.turn_given_back = False

    def running_for(self) -> float:
        """Seconds since the call started (0 while it waits in the queue)."""
        return 0.0 if self.started_at is None else time.perf_counter() - self.started_at


class EnvThreadPool(Executor):
    """An executor of ``threads`` daemon threads whose stuck calls can be written off. Counters: ``busy_s``,
    ``abandoned_running``, ``abandoned_total``."""

    def __init__(self, threads: int, *, name: str = "gigpo-env") -> None:
        Range("threads", "int", "0 = calls run inline", low=0).check(threads)
        self.threads, self.name = threads, name
        self._queue: queue.SimpleQueue[EnvCallFuture | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._live = 0  # threads serving the queue (abandoned ones not counted)
        self._idle = 0  # of those, threads waiting for work
        self._spawned = 0
        self._shutdown = False
        self._helper: _InlineRunner | None = None  # inline pools: the thread that runs calls with a deadline
        self._busy_s = 0.0
        self._abandoned_running = 0
        self._abandoned_total = 0

    @property
    def inline(self) -> bool:
        """Calls run on the caller's thread (``threads == 0``)."""
        return self.threads == 0

    @property
    def busy_s(self) -> float:
        """Seconds spent inside calls, summed over threads (inline calls included)."""
        return self._busy_s

    @property
    def abandoned_running(self) -> int:
        """Abandoned calls whose thread is still running (it leaves when the call returns)."""
        return self._abandoned_running

    @property
    def abandoned_total(self) -> int:
        """Calls ever abandoned by this pool."""
        return self._abandoned_total

    # ------------------------------------------------------------------ Executor API
    def submit(
        self, fn: Callable[..., Any], /, *args: Any, turn: TurnLock | None = None, **kwargs: Any
    ) -> EnvCallFuture:
        """Schedule ``fn(*args, **kwargs)``; an inline pool runs it now and returns a finished future. With a
        ``turn``, the call starts once it holds that turn (module docstring)."""
        future = EnvCallFuture(fn, args, kwargs)
        future.turn = turn
        if self.inline:
            future.set_running_or_notify_cancel()
            self._run(future)
            return future
        with self._lock:
            if self._shutdown:
                raise RuntimeError(f"{self.name}: submit after shutdown")
            if self._idle > 0:
                self._idle -= 1  # an idle thread takes it
            elif self._live < self.threads:
                self._start_thread()
        self._queue.put(future)
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Let the serving threads finish the queued calls and exit; abandoned threads are left alone, and nothing
        is joined (``wait`` is accepted for the Executor API: daemon threads never block the process's exit)."""
        with self._lock:
            self._shutdown = True
            live = self._live
        if cancel_futures:
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item.cancel()
        for _ in range(live):
            self._queue.put(None)
        if self._helper is not None:
            self._helper.calls.put(None)

    # ------------------------------------------------------------------ deadlines
    def abandon(self, future: EnvCallFuture) -> bool:
        """Write off the thread running ``future`` and start a replacement; False if it already finished or was
        abandoned. Later callbacks run in the abandoned thread when the call returns."""
        with self._lock:
            if future.done() or future.abandoned:
                return False
            if future.started_at is None:
                raise ValueError(f"{self.name}: a queued call cannot be abandoned, only one that is running")
            future.abandoned = True
            self._abandoned_running += 1
            self._abandoned_total += 1
            self._live -= 1  # its thread leaves the pool when the call returns
            if not self._shutdown:
                self._start_thread()
            self._give_back_turn(future)
        return True

    def _give_back_turn(self, future: EnvCallFuture) -> None:
        """Pass ``future``'s turn on, once (the caller holds the pool's lock)."""
        if future.turn is not None and not future.turn_given_back:
            future.turn_given_back = True
            future.turn.release()

    def call_inline(self, fn: Callable[..., Any], args: tuple, timeout: float | None) -> EnvCallFuture:
        """Run ``fn(*args)`` inline (``threads=0``) and return the finished future; with a ``timeout`` it runs in a
        helper thread and is abandoned past it (:class:`CallAbandoned`)."""
        if not self.inline:
            raise RuntimeError(f"{self.name}: call_inline is for inline pools (threads=0)")
        if timeout is None:
            return self.submit(fn, *args)
        with self._lock:
            if self._helper is None:
                self._helper = _InlineRunner(self, self._spawned + 1)
                self._spawned += 1
            helper = self._helper
        future = EnvCallFuture(fn, args, {})
        future.set_running_or_notify_cancel()
        helper.calls.put(future)
        try:
            helper.done.get(timeout=timeout)
            return future
        except queue.Empty:
            pass
        with helper.lock:  # decided under the helper's lock: finished just now, or abandoned
            finished = future.done()
            if not finished:
                future.abandoned = helper.abandoned = True
        if finished:
            helper.done.get()  # its token comes (the helper saw abandoned False)
            return future
        with self._lock:
            self._abandoned_running += 1
            self._abandoned_total += 1
            self._helper = None  # the next call gets a fresh helper
        raise CallAbandoned(future, future.running_for())

    # ------------------------------------------------------------------ threads
    def _start_thread(self) -> None:
        """Start one serving thread (the caller holds the lock)."""
        self._live += 1
        self._spawned += 1
        threading.Thread(target=self._serve, name=f"{self.name}-{self._spawned}", daemon=True).start()

    def _serve(self) -> None:
        while True:
            future = self._queue.get()
            if future is None:
                with self._lock:
                    self._live -= 1
                return
            if not future.set_running_or_notify_cancel():
                with self._lock:
                    self._idle += 1
                continue
            self._run(future)
            with self._lock:
                if future.abandoned:  # written off and replaced: leave
                    self._abandoned_running -= 1
                    return
                self._idle += 1

    def _run(self, future: EnvCallFuture) -> None:
        fn, args, kwargs = future.fn, future.args, future.kwargs
        future.fn = future.args = future.kwargs = None  # the future must not keep the environment alive
        if future.turn is not None:
            future.turn.acquire()
        future.started_at = time.perf_counter()
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to whoever awaits the future, which records it
            self._finish(future)
            future.set_exception(exc)
        else:
            self._finish(future)
            future.set_result(result)

    def _finish(self, future: EnvCallFuture) -> None:
        future.elapsed_s = time.perf_counter() - future.started_at
        with self._lock:
            self._busy_s += future.elapsed_s
            if not future.abandoned:  # an abandoned call's turn was passed on when it was abandoned
                self._give_back_turn(future)


class _InlineRunner:
    """The helper thread of an inline pool's calls with a deadline: takes futures from ``calls``, runs them (via the
    pool, so ``busy_s`` counts them) and signals ``done``; once ``abandoned`` it finishes its call and leaves."""

    def __init__(self, pool: EnvThreadPool, number: int) -> None:
        self.pool = pool
        self.calls: queue.SimpleQueue[EnvCallFuture | None] = queue.SimpleQueue()
        self.done: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.abandoned = False
        threading.Thread(target=self._serve, name=f"{pool.name}-inline-{number}", daemon=True).start()

    def _serve(self) -> None:
        while True:
            future = self.calls.get()
            if future is None:
                return
            self.pool._run(future)
            with self.lock:
                if not self.abandoned:
                    self.done.put(True)
                    continue
            with self.pool._lock:
                self.pool._abandoned_running -= 1
            return
