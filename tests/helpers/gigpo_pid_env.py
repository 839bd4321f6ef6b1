"""A gridnav hosted in environment worker processes that says which process built it: drives tests/test_multinode.py.

``PidGridNav`` declares ``thread_parallel = False``, so the episode runner of each agent-loop worker hosts it in
environment worker processes (children of that agent-loop worker, ``verl_gigpo.rollout.execution.procpool``). Each
instance appends one line ``<pid> <parent pid>`` to ``<record_dir>/pids.txt`` (``record_dir``: a constructor argument,
given as ``env.kwargs.record_dir``, so every process agrees), so a test can map each environment worker process to its
agent-loop worker, and through Ray's state to a node. Without ``record_dir`` it records nothing (a plain gridnav).
Register it in the workers with ``+env.registry.NAME=gigpo_pid_env:PidGridNav`` (this folder on their
``PYTHONPATH``).
"""

from __future__ import annotations

import os
from pathlib import Path

from environments.gridnav.env import GridNavEnv

#: the file, inside ``record_dir``, that gets one ``<pid> <parent pid>`` line per instance
RECORD_NAME = "pids.txt"


class PidGridNav(GridNavEnv):
    """``GridNavEnv`` in worker processes that records ``<pid> <parent pid>`` of the process building it."""

    thread_parallel = False

    def __init__(self, *, record_dir: str | None = None, **kwargs):
        super().__init__(**kwargs)
        if record_dir:
            with open(Path(record_dir) / RECORD_NAME, "a") as out:  # one short line per append: no interleaving
                out.write(f"{os.getpid()} {os.getppid()}\n")


def recorded_pids(record_dir: str | Path) -> list[tuple[int, int]]:
    """The ``(pid, parent pid)`` pairs :class:`PidGridNav` instances recorded in ``record_dir``."""
    path = Path(record_dir) / RECORD_NAME
    if not path.exists():
        return []
    return [(int(a), int(b)) for a, b in (line.split() for line in path.read_text().splitlines() if line.strip())]
