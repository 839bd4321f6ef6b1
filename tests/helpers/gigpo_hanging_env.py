"""A gridnav whose step (or reset) never returns for one task: drives the environment deadlines in the tests.

Register it where the episodes run: ``register_env("gridnav_hang", "gigpo_hanging_env:HangingGridNav")`` in the test
process (in a fixture: registered at import, it would join the registry tests' parametrisation), or ``env.registry``
for verl's agent-loop workers (this folder on their ``PYTHONPATH``). Which task hangs
comes from constructor arguments (``env.kwargs``), so every process agrees:

* ``hang_seed``: the task seed that hangs (default -1: none, so the registry's checker sees a plain gridnav);
* ``hang_at``: ``"step"`` (the ``hang_step``-th step of that task, default 2), ``"reset"``, or ``"exit"`` (the
  process ends at that step instead, exit code 3: a crashing engine).

A hung call waits on :data:`RELEASE` (a process-wide event the tests may set to let abandoned threads finish);
in a worker process nothing sets it, so only killing the process ends the call. ``HangingGridNavProc`` is the same
environment declaring ``thread_parallel = False``, so the episode runner hosts it in worker processes.
"""

from __future__ import annotations

import os
import re
import threading

from environments.gridnav.env import GridNavEnv

#: set it to release every hung call of this process
RELEASE = threading.Event()
#: instances whose close() ran (the runner closes an abandoned instance once its hung call returns)
CLOSED: list[HangingGridNav] = []


def waited_seconds(message: str) -> float:
    """The seconds an ``EnvDeadlineError`` message says its call was given (its ``(waited N s)`` part)."""
    found = re.search(r"\(waited (\d+\.\d+) s\)", message)
    assert found, f"no '(waited N s)' in {message!r}"
    return float(found.group(1))


class HangingGridNav(GridNavEnv):
    """``GridNavEnv`` whose ``hang_step``-th step (or reset) of task ``hang_seed`` blocks until :data:`RELEASE`."""

    def __init__(self, *, hang_seed: int = -1, hang_at: str = "step", hang_step: int = 2, **kwargs):
        super().__init__(**kwargs)
        if hang_at not in ("step", "reset", "exit"):
            raise ValueError(f"hang_at must be 'step', 'reset' or 'exit', got {hang_at!r}")
        self.hang_seed, self.hang_at, self.hang_step = int(hang_seed), hang_at, int(hang_step)
        self.hung = False

    def _hang(self) -> None:
        self.hung = True
        RELEASE.wait()

    def _reset(self, split, options):
        if self.hang_at == "reset" and self.seed == self.hang_seed:
            self._hang()
        return super()._reset(split, options)

    def step(self, action):
        if self.seed == self.hang_seed and self._step_count + 1 == self.hang_step:  # valid or invalid action alike
            if self.hang_at == "step":
                self._hang()
            elif self.hang_at == "exit":
                os._exit(3)
        return super().step(action)

    def close(self) -> None:
        CLOSED.append(self)
        super().close()


class HangingGridNavProc(HangingGridNav):
    """:class:`HangingGridNav` hosted in worker processes (``thread_parallel = False``)."""

    thread_parallel = False
