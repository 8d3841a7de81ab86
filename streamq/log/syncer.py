"""The fsync worker: the one place where the log's fsync calls run.

Owns a single background thread. Logs hand it whole rounds of work (fdatasync of several
files, index files, a directory fsync) so that fsync never runs on the event-loop thread;
the log itself does the group commit (one round covers every append made before it).
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class Syncer:
    """A one-thread executor for fsync rounds, shared by every log of a broker."""

    def __init__(self) -> None:
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="streamq-fsync"
        )

    def submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        return self._executor.submit(fn)

    def close(self) -> None:
        """Wait for the rounds already submitted, then stop the thread."""
        self._executor.shutdown(wait=True)
