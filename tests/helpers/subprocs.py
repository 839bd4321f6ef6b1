"""Fresh Python processes started together and read one by one (tests whose subject is a new process: an entry
point, what ``import verl`` loads). Each such process spends seconds importing torch and verl on one core; started
at once, two or three of them cost about the time of the slowest instead of the sum."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path


class Started:
    """Subprocesses started at construction, one per name; :meth:`result` waits for one and returns its outcome.

    Args:
        commands: name -> argv.
        cwd: working folder of every process.
        timeout: seconds each may take, counted from :meth:`result`'s call.
    """

    def __init__(self, commands: Mapping[str, Sequence[str]], *, cwd: Path | None = None, timeout: float = 180):
        self.timeout = timeout
        self._procs = {
            name: subprocess.Popen(list(argv), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for name, argv in commands.items()
        }
        self._done: dict[str, subprocess.CompletedProcess] = {}

    def result(self, name: str) -> subprocess.CompletedProcess:
        """The finished process ``name`` (``returncode``, ``stdout``, ``stderr``); kills it after ``timeout`` s.

        Raises:
            KeyError: no process of that name.
            subprocess.TimeoutExpired: it did not finish in time.
        """
        if name not in self._done:
            proc = self._procs[name]
            try:
                out, err = proc.communicate(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                raise
            self._done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        return self._done[name]

    def close(self) -> None:
        """Kill the processes nobody read (a test that failed before reading them)."""
        for name, proc in self._procs.items():
            if name not in self._done and proc.poll() is None:
                proc.kill()
                proc.communicate()
