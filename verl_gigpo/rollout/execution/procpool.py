"""Environments in worker processes: parallel steps for environments that hold a process-wide lock (ALFWorld).

:class:`ProcessEnvHost` runs instances of a ``thread_parallel = False`` environment in worker processes
(:mod:`verl_gigpo.rollout.execution.procworker`); the episode runner talks to one through a :class:`RemoteEnv`
(``reset``/``step``/``close`` over the worker's pipe; every other attribute on a local view). Placement, deadlines,
replay after a lost worker and shutdown: docs/environments-execution.md.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import queue
import subprocess
import sys
import threading
import weakref
from collections import Counter, defaultdict
from collections.abc import Hashable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from environments import EnvError, TextEnv, env_class, env_target
from environments.base import PromptStyle
from verl_gigpo.config.rules import Range
from verl_gigpo.rollout.execution import EnvDeadlineError, EnvExecution
from verl_gigpo.rollout.execution.wire import Wire, rebuild_error
from verl_gigpo.rollout.types import EpisodeConfig, TaskSpec

__all__ = ["ProcessEnvHost", "RemoteEnv", "view_class"]

logger = logging.getLogger(__name__)

#: seconds a worker process may take to start (import the environments) before its start counts as failed
START_TIMEOUT_S = 120.0

_VIEW_CLASSES: dict[type, type] = {}
_HOSTS: weakref.WeakSet[ProcessEnvHost] = weakref.WeakSet()
_IDS = itertools.count(1)


def view_class(cls: type[TextEnv]) -> type[TextEnv]:
    """The view class of environment class ``cls``: ``cls`` whose ``_admissible_actions()`` returns the admissible
    actions of the last ``info`` seen (``set_admissible``), built with ``TextEnv.__init__`` only (no engine)."""
    if cls not in _VIEW_CLASSES:

        def __init__(self: Any, *, key_mode: str, max_steps: int) -> None:
            TextEnv.__init__(self, key_mode=key_mode, max_steps=max_steps)
            self._view_admissible = None

        def _admissible_actions(self: Any) -> list[str] | None:
            return None if self._view_admissible is None else list(self._view_admissible)

        def set_admissible(self: Any, actions: Sequence[str] | None) -> None:
            self._view_admissible = None if actions is None else list(actions)

        _VIEW_CLASSES[cls] = type(
            f"{cls.__name__}View",
            (cls,),
            {
                "__init__": __init__,
                "_admissible_actions": _admissible_actions,
                "set_admissible": set_admissible,
                "__doc__": f"A view of {cls.__name__} for parse_action/render_prompt "
                "(verl_gigpo.rollout.execution.procpool).",
            },
        )
    return _VIEW_CLASSES[cls]


class RemoteEnv:
    """An environment instance in a worker process: ``reset``/``step``/``close`` block until the worker answers;
    any other attribute comes from the local view."""

    def __init__(self, host: ProcessEnvHost, slot: _Slot, iid: int, task: TaskSpec, config: EpisodeConfig):
        self._host, self._slot, self.iid = host, slot, iid
        self._generation = slot.generation
        self._pool_key: Hashable = None
        self._task_key: Hashable = None
        self.env_name = task.env_name
        self.view = view_class(env_class(task.env_name))(key_mode=config.key_mode, max_steps=config.max_steps)
        self.view.parse_style = config.parse  # as make_task_env sets it on the instance in the worker
        self.steps_taken = 0
        self.dead = False  # its call hung or crashed the worker: never restored
        self.make_args = (task.env_name, env_target(task.env_name), task, config)
        self.replay: list[tuple[str, tuple]] = []  # the requests since the last reset (to rebuild it elsewhere)
        self.last_anchor_key: str | None = None

    @property
    def alive(self) -> bool:
        """False once the worker process holding the instance was replaced (the instance is gone)."""
        return self._generation == self._slot.generation

    def record(self, op: str, args: tuple, value: Any) -> None:
        """Note an answered request (driver thread): the view follows the ``info`` of a reset/step (admissible
        actions, task, task id/type, step) and the replay list grows (a reset starts it anew)."""
        if op not in ("reset", "step"):
            return
        self.replay = [(op, args)] if op == "reset" else [*self.replay, (op, args)]
        info = value[-1]
        self.view.set_admissible(info.get("admissible_actions"))
        self.view.task_description = info.get("task", self.view.task_description)
        self.view.task_id, self.view.task_type = info.get("task_id"), info.get("task_type")
        self.steps_taken = int(info.get("step", 0))
        self.last_anchor_key = info.get("anchor_key")

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """``reset`` in the worker (blocking)."""
        return self._host.call(self, "reset", (seed, options)).result()[0]

    def step(self, action: str | None) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """``step`` in the worker (blocking)."""
        return self._host.call(self, "step", (action,)).result()[0]

    def close(self) -> None:
        """Close the instance in its worker (does not wait)."""
        self._host.discard(self)

    def parse_action(self, llm_text: str, rule: str = "admissible") -> tuple[str | None, bool]:
        """The class's ``parse_action`` (the same signature: the reply and the invalid-action ``rule``) on the view
        (this process, no request)."""
        return self.view.parse_action(llm_text, rule=rule)

    def render_prompt(
        self,
        observation: str,
        info: dict[str, Any],
        history: Sequence[tuple[str, str]] = (),
        style: PromptStyle | None = None,
    ) -> str:
        """The class's ``render_prompt`` (the same signature) on the view (this process, no request)."""
        return self.view.render_prompt(observation, info, history, style)

    def __getattr__(self, name: str) -> Any:
        if name == "view":  # not set yet (during __init__): no recursion
            raise AttributeError(name)
        return getattr(self.view, name)

    def __repr__(self) -> str:
        return f"RemoteEnv({self.env_name!r}, instance {self.iid}, worker {self._slot.index})"


@dataclass
class _Request:
    """One request to a worker; ``future`` resolves to ``(value, seconds)``."""

    op: str
    env: RemoteEnv
    args: tuple
    timeout: float | None
    timeout_key: str
    step: int
    future: Future = field(default_factory=Future)


class _WorkerFailed(Exception):
    """The worker missed a deadline or died during a request (it has been replaced); ``error`` is what the caller
    gets."""

    def __init__(self, error: EnvError):
        super().__init__(str(error))
        self.error = error


class _Slot:
    """One worker process (started on first use, replaced when it dies or misses a deadline) and its driver."""

    def __init__(self, host: ProcessEnvHost, index: int):
        self.host, self.index = host, index
        self.generation = 0
        self.proc: subprocess.Popen | None = None
        self.wire: Wire | None = None
        self.queue: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self.live = 0  # acquired instances, not yet released
        self.tasks: Counter[Hashable] = Counter()  # task key -> live instances of that task here
        self.idle: dict[Hashable, list[RemoteEnv]] = defaultdict(list)
        self.thread = threading.Thread(target=self._drive, name=f"gigpo-env-proc-{index}", daemon=True)
        self.thread.start()

    # ------------------------------------------------------------------ driver thread
    def _drive(self) -> None:
        """Send each request, wait for its answer under its deadline, resolve its future (driver thread)."""
        while True:
            request = self.queue.get()
            if request is None:
                self._stop()
                return
            if not request.future.set_running_or_notify_cancel():
                continue
            try:
                self._serve(request)
            except BaseException as exc:  # noqa: BLE001 - the driver must outlive any one request; the caller gets it
                logger.exception("environment worker %d: request %s failed in its driver", self.index, request.op)
                if not request.future.done():
                    request.future.set_exception(exc)

    def _serve(self, request: _Request) -> None:
        """One request: restore its instance first when it was lost with a replaced worker (driver thread)."""
        env, op = request.env, request.op
        if self.proc is not None and self.proc.poll() is not None:  # died between requests (killed, crashed idle)
            self._died_idle()
        if op != "make" and not env.alive:
            if op == "close":
                request.future.set_result((None, 0.0))
                return
            if env.dead:
                request.future.set_exception(self._lost(request, "it was the instance that failed"))
                return
            try:
                self._restore(env)
            except Exception as exc:  # noqa: BLE001 - the instance cannot come back: its episode fails with why
                env.dead = True
                request.future.set_exception(self._lost(request, f"replaying its episode failed: {exc}"))
                return
        try:
            value, seconds = self._exchange(request)
        except _WorkerFailed as failure:
            env.dead = True  # the instance whose call hung or crashed its worker never comes back
            request.future.set_exception(failure.error)
        except Exception as exc:  # noqa: BLE001 - the environment's error, a failed start: the caller records it
            request.future.set_exception(exc)
        else:
            request.future.set_result((value, seconds))

    def _exchange(self, request: _Request) -> tuple[Any, float]:
        """One request/answer with the worker (started first if needed). The environment's own error is raised as
        raised there; a missed deadline or a dead worker raises :class:`_WorkerFailed` after replacing the worker."""
        env, op = request.env, request.op
        if self.proc is None:
            self._start()
        if op == "make":  # the instance lives in the current process
            env._generation = self.generation
        assert self.wire is not None and self.proc is not None
        pid = self.proc.pid
        try:
            self.wire.send((op, env.iid, request.args))
            status, value, seconds = self.wire.recv(request.timeout)
        except TimeoutError:
            self._replace()
            raise _WorkerFailed(
                EnvDeadlineError(
                    env.env_name,
                    env.view.task_id,
                    request.step,
                    call=op,
                    waited_s=request.timeout or 0.0,
                    key=request.timeout_key,
                    remedy=f"the instance is dropped and its worker process {pid} was killed and is replaced",
                )
            ) from None
        except (EOFError, OSError) as exc:
            try:  # its end of the pipe closed: it has exited or is exiting
                code = self.proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                code = None
            self._replace()
            logger.warning(
                "environment worker %d: process %d died during %s() (exit code %s); replaced, its episode fails",
                self.index,
                pid,
                op,
                code,
            )
            raise _WorkerFailed(
                EnvError(
                    env.env_name,
                    env.view.task_id,
                    request.step,
                    f"{op}(): the environment worker process {pid} died (exit code {code}, {exc}); it is replaced",
                )
            ) from None
        if status != "ok":
            raise rebuild_error(value)
        env.record(op, request.args, value)
        return value, seconds

    def _died_idle(self) -> None:
        """The worker process ended while no request was in flight (SIGKILL, the OOM killer): replace it now. Its
        instances are rebuilt by replay on their next request; no episode is blamed (driver thread)."""
        assert self.proc is not None
        pid, code = self.proc.pid, self.proc.returncode
        self._replace()
        with self.host.lock:
            self.host.died_idle += 1
        logger.warning(
            "environment worker %d: process %d died between requests (exit code %s); replaced, its instances are "
            "rebuilt by replaying their episodes",
            self.index,
            pid,
            code,
        )

    def _restore(self, env: RemoteEnv) -> None:
        """Rebuild an instance lost with its worker in the fresh one: make it, reset it and replay its steps (the
        environment contract makes that deterministic); the last state must give the anchor key seen last."""
        expected = env.last_anchor_key
        for op, args in [("make", env.make_args), *env.replay]:
            timeout, key = self.host.deadline(op)
            self._exchange(_Request(op, env, args, timeout, key, env.steps_taken + 1 if op == "step" else 0))
        if env.last_anchor_key != expected:
            raise RuntimeError("the replayed episode reached another state (the environment is not deterministic)")
        with self.host.lock:
            self.host.restored += 1

    def _lost(self, request: _Request, why: str) -> EnvError:
        return EnvError(
            request.env.env_name,
            request.env.view.task_id,
            request.step,
            f"{request.op}(): the instance was lost with its worker process, replaced after an environment in it "
            f"missed a deadline or the process died; {why}",
        )

    def _start(self) -> None:
        """Start the worker process and wait for its ready message (driver thread)."""
        read_parent, write_child = os.pipe()
        read_child, write_parent = os.pipe()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))  # the parent's imports
        try:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "verl_gigpo.rollout.execution.procworker",
                    str(read_child),
                    str(write_child),
                    str(os.getpid()),
                ],
                pass_fds=(read_child, write_child),
                stdin=subprocess.DEVNULL,
                env=env,
            )
        finally:
            os.close(read_child)
            os.close(write_child)
        wire = Wire(read_parent, write_parent)
        try:
            hello = wire.recv(START_TIMEOUT_S)
        except (TimeoutError, EOFError) as exc:
            proc.kill()
            proc.wait()
            wire.close()
            raise RuntimeError(
                f"an environment worker process did not start within {START_TIMEOUT_S:.0f} s (exit code "
                f"{proc.returncode}, {exc}); its error output is above in the log"
            ) from exc
        if hello[0] != "ready":
            raise RuntimeError(f"unexpected first message from an environment worker process: {hello!r}")
        self.proc, self.wire = proc, wire
        self.host.started += 1

    def _replace(self) -> None:
        """Kill the worker (if any), forget its instances; the next request starts a fresh one (driver thread)."""
        self._kill()
        with self.host.lock:
            self.generation += 1
            self.idle.clear()
            self.host.replaced += 1

    def _kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
        if self.wire is not None:
            self.wire.close()
        self.proc, self.wire = None, None

    def _stop(self) -> None:
        """End the worker: ask it to exit, kill it after 5 s (driver thread)."""
        if self.proc is not None and self.wire is not None:
            try:
                self.wire.send(("exit", 0, ()))
                self.proc.wait(timeout=5.0)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._kill()


class ProcessEnvHost:
    """``num_workers`` worker processes (started when needed) hosting environment instances; ``max_idle`` idle
    instances kept per worker and kind. Counters: ``created``, ``reused``, ``started``, ``replaced``, ``died_idle``,
    ``restored`` (instances rebuilt by replay)."""

    def __init__(self, num_workers: int, execution: EnvExecution | None = None, *, max_idle: int = 64):
        Range("num_workers", "int", "worker processes", low=1).check(num_workers)
        self.num_workers, self.max_idle = num_workers, max_idle
        self.execution = execution if execution is not None else EnvExecution()
        self.lock = threading.Lock()
        self._slots: list[_Slot] = []
        self._closed = False
        self.created = self.reused = self.started = self.replaced = self.restored = self.died_idle = 0
        _HOSTS.add(self)

    # ------------------------------------------------------------------ instances
    def acquire(self, task: TaskSpec, config: EpisodeConfig, pool_key: Hashable) -> Future:
        """A future of ``(RemoteEnv, seconds)``: an idle instance of kind ``pool_key`` on the chosen worker, or one
        built there (``make`` under ``env.reset_timeout_s``). The caller resets it, and releases it with
        :meth:`release`."""
        task_key = (pool_key, task.seed, task.split)
        with self.lock:
            if self._closed:
                raise RuntimeError("the environment process host is closed")
            slot = self._choose(task_key, pool_key)
            slot.live += 1
            slot.tasks[task_key] += 1
            idle = slot.idle.get(pool_key)
            env = idle.pop() if idle else None
            if env is not None:
                self.reused += 1
            else:
                self.created += 1
        if env is not None:
            env._task_key = task_key
            done: Future = Future()
            done.set_result((env, 0.0))
            return done
        env = RemoteEnv(self, slot, next(_IDS), task, config)
        env._pool_key, env._task_key = pool_key, task_key
        request = self._request(env, "make", (task.env_name, env_target(task.env_name), task, config), step=0)
        result: Future = Future()

        def made(future: Future) -> None:
            error = future.exception()
            if error is not None:
                self._unplace(env)
                result.set_exception(error)
            else:
                result.set_result((env, future.result()[1]))

        request.add_done_callback(made)
        return result

    def call(self, env: RemoteEnv, op: str, args: tuple) -> Future:
        """A future of ``(value, seconds)`` of ``op`` (``"reset"`` or ``"step"``) on ``env`` in its worker."""
        step = env.steps_taken + 1 if op == "step" else 0
        return self._request(env, op, args, step=step)

    def release(self, env: RemoteEnv, broken: bool = False) -> None:
        """Give ``env`` back after an episode: kept idle on its worker for reuse, or closed there (``broken``, too
        many idle ones); an instance whose worker was replaced is only forgotten. Does not wait."""
        self._unplace(env)
        with self.lock:
            if not env.alive:
                return
            idle = env._slot.idle[env._pool_key]
            if not broken and len(idle) < self.max_idle and not self._closed:
                idle.append(env)
                return
        self.discard(env, placed=False)

    def discard(self, env: RemoteEnv, *, placed: bool = True) -> None:
        """Close ``env`` in its worker without waiting (``placed``: it was acquired and not yet released)."""
        if placed:
            self._unplace(env)
        if env.alive and not self._closed:
            self._request(env, "close", (), step=env.steps_taken)

    def _unplace(self, env: RemoteEnv) -> None:
        with self.lock:
            if env._task_key is None:
                return
            slot = env._slot
            slot.live -= 1
            slot.tasks[env._task_key] -= 1
            if slot.tasks[env._task_key] <= 0:
                del slot.tasks[env._task_key]
            env._task_key = None

    def _choose(self, task_key: Hashable, pool_key: Hashable) -> _Slot:
        """The worker for a new episode (the caller holds the lock): the one holding the same task, else the least
        loaded one (a worker not started yet counts as empty), preferring one with an idle instance of the kind."""
        while len(self._slots) < self.num_workers and all(s.live > 0 for s in self._slots):
            self._slots.append(_Slot(self, len(self._slots)))
        same = [s for s in self._slots if s.tasks.get(task_key)]
        if same:
            return min(same, key=lambda s: s.live)
        return min(self._slots, key=lambda s: (s.live, not s.idle.get(pool_key), s.index))

    def deadline(self, op: str) -> tuple[float | None, str]:
        """The deadline of request ``op`` and its description for messages (``"env.step_timeout_s=60 s"``)."""
        if op in ("make", "reset"):
            timeout, key = self.execution.reset_timeout_s, "env.reset_timeout_s"
        else:
            timeout, key = self.execution.step_timeout_s, "env.step_timeout_s"
        return timeout, f"{key}={timeout:g} s" if timeout else key

    def _request(self, env: RemoteEnv, op: str, args: tuple, *, step: int) -> Future:
        request = _Request(op, env, args, *self.deadline(op), step)
        if self._closed:
            request.future.set_exception(RuntimeError("the environment process host is closed"))
        else:
            env._slot.queue.put(request)
        return request.future

    # ------------------------------------------------------------------ lifetime
    def worker_pids(self) -> list[int]:
        """Process ids of the running workers."""
        return [s.proc.pid for s in self._slots if s.proc is not None]

    def close(self, timeout: float = 10.0) -> None:
        """End every worker process (asked to exit, killed after 5 s) and their driver threads. Safe to call twice.
        Requests still queued fail with ``RuntimeError``."""
        with self.lock:
            if self._closed:
                return
            self._closed = True
            slots = list(self._slots)
        for slot in slots:
            while True:  # fail what is queued: the host is going away
                try:
                    request = slot.queue.get_nowait()
                except queue.Empty:
                    break
                if request is not None and request.future.set_running_or_notify_cancel():
                    request.future.set_exception(RuntimeError("the environment process host is closed"))
            slot.queue.put(None)
        for slot in slots:
            slot.thread.join(min(timeout, 6.0))
            if slot.thread.is_alive():  # its driver waits on a stuck call: kill the worker to wake it
                if slot.proc is not None:
                    slot.proc.kill()
                slot.thread.join(timeout)


@atexit.register
def _close_hosts() -> None:
    """End the worker processes of every host still open at interpreter exit."""
    for host in list(_HOSTS):
        host.close()
