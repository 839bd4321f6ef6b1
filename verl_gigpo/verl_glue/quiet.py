"""Warnings of verl's dependencies that repeat without telling the user anything new: each shown once per process
(TransferQueue's thread-count warning, on every put and get where the machine has fewer than 8 cores)."""

from __future__ import annotations

import logging
import re
import threading

__all__ = ["REPEATED", "OncePerProcess", "quiet_repeated_warnings"]

#: logger name -> the messages of it shown once per process
REPEATED: dict[str, re.Pattern[str]] = {
    "transfer_queue.utils.common": re.compile(r"target_num_threads \d+ should not exceed total physical CPU cores"),
}


class OncePerProcess(logging.Filter):
    """Passes the first record whose message matches ``pattern``, drops the later ones; other records pass."""

    def __init__(self, pattern: re.Pattern[str]) -> None:
        super().__init__()
        self.pattern = pattern
        self._seen = False
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.pattern.search(record.getMessage()):
            return True
        with self._lock:
            first, self._seen = not self._seen, True
        return first


def quiet_repeated_warnings() -> None:
    """Attach a :class:`OncePerProcess` filter for each entry of :data:`REPEATED` (once)."""
    for name, pattern in REPEATED.items():
        target = logging.getLogger(name)
        if not any(isinstance(f, OncePerProcess) and f.pattern is pattern for f in target.filters):
            target.addFilter(OncePerProcess(pattern))
