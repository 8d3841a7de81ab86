"""The fsync worker: the one place where the log's fsync calls run.

Owns a single background thread. Logs hand it their segment writes (see `writer`) and
whole rounds of work (fdatasync of several files, index files, a directory fsync), in
order, so that neither writes nor fsync run on the event-loop thread; the log itself does
the group commit (one round covers every append made before it).
It also keeps the broker-wide view of a full disk: which logs wait for room (`out_of_space`)
and who to tell when that changes (`space_listeners`, the gateway's resource alarm).
It times each round (`round_seconds`, a histogram for the metrics endpoint): two clock
reads and a few integer additions per round, on the fsync thread.

On a cluster leader a round is not over when its fsyncs are: `gate` (the replication
server) holds it until every in-sync replica has the bytes the tap recorded up to then,
and only then completes the round's future, on whatever thread the gate releases it. The
fsync thread is not held meanwhile: it runs the next rounds, which queue behind the gate
in the same way. Confirms, Declare-Oks, tx.commit-oks and management replies all wait for
rounds, so they all wait for the replicas with no change to their code.
"""

from __future__ import annotations

import bisect
import concurrent.futures
import contextlib
import mmap
import time
from collections.abc import Callable
from typing import Final, Protocol, TypeVar

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


class ReplicationGate(Protocol):
    def hold(self, done: Callable[[BaseException | None], None]) -> None:
        """Called on the fsync thread right after a round's writes and fsyncs succeeded.
        The gate reads the tap's position now and calls done(None) (from any thread,
        exactly once) when every in-sync replica has acked that position, or done(exc) to
        fail the round (this node is no longer leader: ReplicationFenced)."""


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
        # Set by the cluster controller right after the Broker is made, before any
        # listener opens; None on a single node.
        self.gate: ReplicationGate | None = None

    def release_staging(self) -> None:
        """Give the staging buffer's pages back to the kernel (they read as zeros after),
        after the writes handed over so far: a 4 MiB write keeps 4 MiB of it resident.
        For a broker at rest; the next direct write faults in what it uses."""
        with contextlib.suppress(RuntimeError):  # closed: nothing to give back for
            self.submit_write(self._release_staging)

    def _release_staging(self) -> None:
        self.staging.madvise(mmap.MADV_REMOVE)  # shared anonymous memory: REMOVE, not DONTNEED

    def space_changed(self, directory: str, *, out_of_space: bool) -> None:
        """A log ran out of disk space, or has room again: tell the listeners."""
        if out_of_space:
            self.out_of_space.add(directory)
        else:
            self.out_of_space.discard(directory)
        for listener in self.space_listeners:
            listener()

    def submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Run an fsync round on the thread, timed into `round_seconds`. With a gate, the
        future completes once the gate releases the round (or fails with what the gate
        gives, ReplicationFenced). Raises RuntimeError once the Syncer is closed."""
        gate = self.gate
        if gate is None:
            return self._executor.submit(self._timed, fn)
        held: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._executor.submit(self._gated, fn, gate, held)
        return held

    def submit_round(
        self, fn: Callable[[], T]
    ) -> tuple[concurrent.futures.Future[T], concurrent.futures.Future[None] | None]:
        """`submit` in two steps, so that a log can start its next round while the
        replicas catch up with this one: the first future completes when the round ran
        here (its writes and fsyncs done), the second when the gate released it (or with
        what the gate gives, ReplicationFenced); None without a gate. A round that
        failed here fails both."""
        gate = self.gate
        if gate is None:
            return self._executor.submit(self._timed, fn), None
        local: concurrent.futures.Future[T] = concurrent.futures.Future()
        replicated: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._executor.submit(self._gated_round, fn, gate, local, replicated)
        return local, replicated

    def _gated_round(
        self,
        fn: Callable[[], T],
        gate: ReplicationGate,
        local: concurrent.futures.Future[T],
        replicated: concurrent.futures.Future[None],
    ) -> None:
        try:
            result = self._timed(fn)
        except BaseException as exc:
            for future in (replicated, local):
                if future.set_running_or_notify_cancel():
                    future.set_exception(exc)
            return
        gate.hold(lambda exc: _settle(replicated, None, exc))
        _settle(local, result, None)

    def barrier(self) -> concurrent.futures.Future[None]:
        """An empty round: done once everything submitted before it ran and (with a
        gate) reached the replicas. For writes made outside rounds (management changes
        on worker threads), whose replies must wait for the replicas too."""
        return self.submit(lambda: None)

    def _gated(
        self, fn: Callable[[], T], gate: ReplicationGate, held: concurrent.futures.Future[T]
    ) -> None:
        """On the thread: run the round, then hand it to the gate."""
        try:
            result = self._timed(fn)
        except BaseException as exc:
            if held.set_running_or_notify_cancel():
                held.set_exception(exc)
            return
        gate.hold(lambda exc: _settle(held, result, exc))

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


def _settle(future: concurrent.futures.Future[T], result: T, exc: BaseException | None) -> None:
    """Complete a held round's future (once; a cancelled one stays cancelled)."""
    if not future.set_running_or_notify_cancel():
        return
    if exc is None:
        future.set_result(result)
    else:
        future.set_exception(exc)
