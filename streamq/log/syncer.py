"""The fsync worker: the one place where the log's fsync calls run.

Owns a single background thread. Logs hand it their segment writes (see `writer`) and
whole rounds of work (fdatasync of several files, index files, a directory fsync), in
order, so that neither writes nor fsync run on the event-loop thread; the log itself does
the group commit (one round covers every append made before it).
It also keeps the broker-wide view of a full disk: which logs wait for room (`out_of_space`)
and who to tell when that changes (`space_listeners`, the gateway's resource alarm).
It times each round (`round_seconds`, a histogram for the metrics endpoint): two clock
reads and a few integer additions per round, on the fsync thread.
"""

from __future__ import annotations

import bisect
import concurrent.futures
import time
from collections.abc import Callable
from typing import Final, TypeVar

from streamq.log.writer import staging_buffer

T = TypeVar("T")

# Upper bounds of the fsync round histogram, in seconds (Prometheus' `le`).
ROUND_SECONDS_BUCKETS: Final = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


class Histogram:
    """Counts of durations by bucket (not cumulative; the last counts the rest), their
    sum and count. Written by one thread; readers may see a round half-added."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum_s = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.sum_s += seconds
        self.count += 1


class Syncer:
    """A one-thread executor for fsync rounds, shared by every log of a broker."""

    def __init__(self, *, direct_io: bool = True) -> None:
        # False: the logs of this Syncer write through the page cache (`streamq serve
        # --no-direct-io`), whatever their LogConfig says.
        self.direct_io = direct_io
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="streamq-fsync"
        )
        self.round_seconds = Histogram(ROUND_SECONDS_BUCKETS)
        # The aligned buffer segment writes are assembled in, used only on the thread.
        self.staging = staging_buffer()
        # The directories of the logs whose writes wait for disk space, and what to call
        # when that set changes; both used on the event loop only.
        self.out_of_space: set[str] = set()
        self.space_listeners: list[Callable[[], object]] = []

    def space_changed(self, directory: str, *, out_of_space: bool) -> None:
        """A log ran out of disk space, or has room again: tell the listeners."""
        if out_of_space:
            self.out_of_space.add(directory)
        else:
            self.out_of_space.discard(directory)
        for listener in self.space_listeners:
            listener()

    def submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Run an fsync round on the thread, timed into `round_seconds`."""
        return self._executor.submit(self._timed, fn)

    def submit_write(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Run a segment write on the thread, after everything submitted before it."""
        return self._executor.submit(fn)

    def _timed(self, fn: Callable[[], T]) -> T:
        started = time.perf_counter()
        try:
            return fn()
        finally:
            self.round_seconds.observe(time.perf_counter() - started)

    def close(self) -> None:
        """Wait for the rounds already submitted, then stop the thread."""
        self._executor.shutdown(wait=True)
