"""The pipe protocol between :mod:`verl_gigpo.rollout.execution.procpool` and its worker processes
(:mod:`verl_gigpo.rollout.execution.procworker`): length-framed pickles, and exceptions that survive the trip.

Every reply is ``("ok", value, seconds)`` or ``("error", description, seconds)``: :func:`describe_error` makes the
description, :func:`rebuild_error` turns it back into an exception on the other side.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import struct
import time
from typing import Any

from environments import EnvError

__all__ = ["Wire", "describe_error", "rebuild_error"]

_HEADER = struct.Struct("!Q")


class Wire:
    """Length-framed pickles over a pair of pipe file descriptors (one reader, one writer)."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.read_fd, self.write_fd = read_fd, write_fd

    def send(self, message: Any) -> None:
        """Pickle ``message`` (raising before anything is written when it cannot be pickled) and write it."""
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        view = memoryview(_HEADER.pack(len(data)) + data)
        while view:
            view = view[os.write(self.write_fd, view) :]

    def recv(self, timeout: float | None = None) -> Any:
        """The next message. Raises ``TimeoutError`` when it has not fully arrived within ``timeout`` seconds
        (None: wait for ever) and ``EOFError`` when the other side closed its end."""
        deadline = None if timeout is None else time.monotonic() + timeout
        (size,) = _HEADER.unpack(self._read(_HEADER.size, deadline))
        return pickle.loads(self._read(size, deadline))

    def _read(self, size: int, deadline: float | None) -> bytes:
        chunks, left = [], size
        while left:
            if deadline is not None:
                remaining = deadline - time.monotonic()
                ready, _, _ = select.select([self.read_fd], [], [], max(remaining, 0.0))
                if not ready:
                    raise TimeoutError(f"no message within the deadline ({size - left} of {size} bytes read)")
            chunk = os.read(self.read_fd, min(left, 1 << 20))
            if not chunk:
                raise EOFError("the other end of the pipe is closed")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        """Close both file descriptors (twice is harmless)."""
        for fd in (self.read_fd, self.write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


def describe_error(exc: BaseException) -> tuple:
    """A picklable description of ``exc``: an :class:`~environments.EnvError` keeps its fields and text, any other
    exception travels pickled when it survives a pickle round trip, else as its type name and text."""
    if isinstance(exc, EnvError):
        return ("EnvError", exc.env_name, exc.task_id, exc.step, str(exc))
    try:
        data = pickle.dumps(exc)
        pickle.loads(data)
    except Exception:  # noqa: BLE001 - any failure to round-trip means: send the text instead
        return ("text", type(exc).__name__, str(exc))
    return ("pickled", data)


def rebuild_error(description: tuple) -> BaseException:
    """The exception of a :func:`describe_error` description (an ``EnvError`` with the same fields and text, the
    original exception, or a ``RuntimeError`` naming the original type)."""
    kind = description[0]
    if kind == "EnvError":
        _, env_name, task_id, step, text = description
        error = EnvError(env_name, task_id, step, "")
        error.args = (text,)  # str(error) is the worker's text, prefix included
        return error
    if kind == "pickled":
        return pickle.loads(description[1])
    return RuntimeError(f"{description[1]}: {description[2]}")
