"""The worker process that hosts environments for :mod:`verl_gigpo.rollout.execution.procpool`.

Started as ``python -m verl_gigpo.rollout.execution.procworker READ_FD WRITE_FD PARENT_PID`` (a fresh interpreter).
It holds environment instances keyed by an integer id and serves one request at a time from its pipe: ``make``
(env name, registry target, task, episode config), ``reset`` (seed, options), ``step`` (action), ``close``, and
``exit`` (no reply). Each reply is ``("ok", value, seconds)`` or ``("error", description, seconds)``
(:mod:`verl_gigpo.rollout.execution.wire`). It ends with its parent and ignores SIGINT
(docs/environments-execution.md).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

from environments import TextEnv, list_envs, register_env
from verl_gigpo.rollout.execution.wire import Wire, describe_error

__all__ = ["main", "serve"]

logger = logging.getLogger(__name__)


def _handle(envs: dict[int, TextEnv], op: str, iid: int, args: tuple) -> Any:
    """Run one request on the instance ``iid`` (see the module docstring)."""
    if op == "make":
        from verl_gigpo.rollout.factory import make_task_env

        name, target, task, config = args
        if name not in list_envs():
            register_env(name, target)
        envs[iid] = make_task_env(task, config)
        return None
    if iid not in envs:
        raise RuntimeError(f"no environment instance {iid} in worker process {os.getpid()}")
    if op == "reset":
        seed, options = args
        return envs[iid].reset(seed=seed, options=options)
    if op == "step":
        return envs[iid].step(args[0])
    if op == "close":
        envs.pop(iid).close()
        return None
    raise ValueError(f"unknown request {op!r}")


def serve(wire: Wire) -> None:
    """Answer requests until ``exit`` or the parent closes the pipe; then close every instance."""
    envs: dict[int, TextEnv] = {}
    wire.send(("ready", os.getpid()))
    try:
        while True:
            try:
                op, iid, args = wire.recv()
            except EOFError:
                return
            if op == "exit":
                return
            start = time.perf_counter()
            try:
                reply = ("ok", _handle(envs, op, iid, args), 0.0)
            except Exception as exc:  # noqa: BLE001 - sent back to the caller, who records it on the episode
                reply = ("error", describe_error(exc), 0.0)
            reply = (reply[0], reply[1], time.perf_counter() - start)
            try:
                wire.send(reply)
            except Exception as exc:  # noqa: BLE001 - an unpicklable result: say so instead
                wire.send(("error", describe_error(RuntimeError(f"{op}: the result cannot be sent: {exc!r}")), 0.0))
    finally:
        for env in envs.values():
            try:
                env.close()
            except Exception:  # noqa: BLE001 - closing at exit: log and go on with the others
                logger.exception("closing an environment at exit failed")


def _die_with_parent(parent_pid: int) -> None:
    """End this process when ``parent_pid`` dies: ``PR_SET_PDEATHSIG`` where available, plus a watchdog thread."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    if os.getppid() != parent_pid:
        os._exit(0)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m verl_gigpo.rollout.execution.procworker READ_FD WRITE_FD PARENT_PID``."""
    read_fd, write_fd, parent_pid = (int(a) for a in (argv if argv is not None else sys.argv[1:]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(parent_pid)
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s env-worker[{os.getpid()}] %(name)s: %(message)s")
    wire = Wire(read_fd, write_fd)
    try:
        serve(wire)
    finally:
        wire.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
