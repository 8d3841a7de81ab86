"""The group commit of a segment log: `LogCommit`, a part of `SegmentLog` (see `state`).

Owns making appends durable: sync companions (`add_sync_companion`), `sync`,
`sync_companions` and `sync_blocking`, and the rounds behind them, each gathered on the
event loop (`_prepare_round`: flush the write buffer, list the descriptors, dup the
companions'), run on the Syncer thread in order after the writes handed to it
(`_run_round`: fdatasync segments, write sealed segments' index files, fsync the directory,
write the `durable` marker) and taken in back on the event loop (`_round_done`), in a
cluster once the replicas have the round too. It also owns the wait for disk space (see
`space`): a round retries the writes that found no room, from a timer.

Durability as the `log` module states it. It holds no state of its own and never reads
records. It hands no segment data to the Syncer: the appender's writes run there before a
round that follows them, and a round only retries those a full disk parked.
"""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import Callable

from streamq.log import files
from streamq.log import format as fmt
from streamq.log.errors import LogError, OutOfSpace
from streamq.log.files import fsync_directory, write_file_atomic
from streamq.log.rounds import CompanionWork, Round, RoundResult
from streamq.log.space import CompanionBatch, SpaceWait, close_batches, run_companions
from streamq.log.state import LogState


class LogCommit(LogState):
    """Group-committed sync rounds of a `SegmentLog`, and its wait for disk space."""

    def add_sync_companion(self, prepare: Callable[[], CompanionWork]) -> None:
        """Make other files durable together with the log (queue journals, definitions).

        At the start of every round, on the caller's thread, `prepare()` writes the
        companion's buffers to the OS and returns the descriptors the round must fdatasync,
        and actions (an atomic file replacement, a directory fsync, an unlink) that the
        round runs on the Syncer thread after every fdatasync, in order. The round works on
        duplicates of the descriptors, so the companion may close its own at any time. A
        companion's data is durable after a round that began after it was written.
        """
        self._companions.append(prepare)

    def remove_sync_companion(self, prepare: Callable[[], CompanionWork]) -> None:
        self._companions.remove(prepare)

    async def sync(self, *, companions: bool = False) -> int:
        """Make every record appended so far durable; return `durable_next`.

        With companions=True, also wait for a round that began after this call, so that
        what the companions wrote before it (acks without new records) is durable too.

        Group commit: concurrent callers share rounds, and one round fsyncs every segment
        with unsynced appends. The fsync runs on the Syncer thread. Raises LogFailed if an
        fsync fails (the log is failed: a failed fsync cannot be retried safely). While
        the log is out of space, waits until the retried writes land and a round makes
        them durable, however long that takes (`out_of_space` tells).
        """
        target = self._next_offset
        round_needed = self._rounds_started + 1 if companions else 0
        while self._durable_next < target or self._rounds_finished < round_needed:
            self._check_usable()
            space = self._space
            if space is not None:
                space.schedule(self._retry_space)
                await asyncio.shield(space.waiter())
                continue
            if await self._replicated_round(target, round_needed):
                continue
            inflight = self._inflight
            if inflight is None:
                inflight = self._inflight = self._start_round()
            if inflight.done():
                # The round is over but its completion callback has not run yet: awaiting
                # a done future does not yield, so yield once to let it run (without this
                # the loop spun forever and hung the broker).
                await asyncio.sleep(0)
                continue
            # shield: a cancelled waiter must not cancel the round others wait on.
            await self._await_round(inflight)
        return self._durable_next

    async def _await_round(self, inflight: asyncio.Future[RoundResult]) -> None:
        """Wait for a round; a failed one (an fsync's EIO) fails the log, and its waiters
        get LogFailed, as `sync` promises, not the round's raw OSError."""
        try:
            await asyncio.shield(inflight)
        except (OSError, RuntimeError) as exc:
            raise self._fail(exc) from exc

    async def sync_companions(self) -> None:
        """Wait for a round that began after this call to make the companions' writes
        durable, even while the log's own writes wait for disk space (their records then
        stay as they are). Lets consumers' acks free segments on a full disk.

        Raises OutOfSpace when the companions' writes found no room either (they are
        retried), LogFailed as `sync`.
        """
        round_needed = self._rounds_started + 1
        while self._rounds_finished < round_needed:
            self._check_usable()
            if await self._replicated_round(0, round_needed):
                continue
            inflight = self._inflight
            if inflight is None:
                inflight = self._inflight = self._start_round()
            if inflight.done():
                await asyncio.sleep(0)  # let its completion callback run (see `sync`)
                continue
            await self._await_round(inflight)
            if self._companions_stalled:
                raise OutOfSpace(errno.ENOSPC, "companion writes wait for room", self.directory)

    def sync_blocking(self) -> int:
        """`sync()` for callers without an event loop: fsyncs before returning. Raises
        OutOfSpace, the log going on, when writes found no room (the next call retries
        them), and LogFailed."""
        self._check_usable()
        if self._inflight is not None:
            raise LogError("sync_blocking while an asynchronous sync is in flight")
        if (
            self._durable_next < self._next_offset
            or self._dir_dirty
            or self._companions
            or self._space is not None
        ):
            work = self._prepare_round()
            try:
                # On the Syncer thread, after the writes handed to it.
                result = self._syncer.submit(lambda: self._run_round(work)).result()
            except (OSError, LogError, RuntimeError) as exc:
                raise self._fail(exc) from exc
            done = self._round_done(work, result)
            if result.segments_done:
                self._durable_next = max(self._durable_next, work.next_offset)
            if not done:
                assert self._space is not None
                raise self._space.error
        return self._durable_next

    def _start_round(self) -> asyncio.Future[RoundResult]:
        work = self._prepare_round()
        self._rounds_started += 1
        number = self._rounds_started
        loop = asyncio.get_running_loop()
        here, replicas = self._syncer.submit_round(lambda: self._run_round(work))
        future = asyncio.wrap_future(here, loop=loop)

        def finished(done: asyncio.Future[RoundResult]) -> None:
            self._inflight = None
            exc = done.exception()
            if exc is not None:
                self._rounds_finished += 1
                self._fail(exc)
                return
            result = done.result()
            self._round_done(work, result)
            complete = result.segments_done
            counted = not self._companions_stalled
            if not counted:
                # It covered nobody's companion work: a later round must (see
                # `sync(companions=True)`, which counts rounds).
                self._rounds_started -= 1
            if replicas is None:
                if complete:
                    self._durable_next = max(self._durable_next, work.next_offset)
                if counted:
                    self._rounds_finished += 1
                return
            # A cluster leader: durable once the in-sync replicas have the round too.
            # The next round may start now; this one's waiters wait for `replicated`.
            replicated = asyncio.wrap_future(replicas, loop=loop)
            durable = work.next_offset if complete else self._durable_next
            self._replicating.append((durable, number if counted else 0, replicated))
            replicated.add_done_callback(lambda f: self._replicated(f, durable, counted))

        future.add_done_callback(finished)
        return future

    def _replicated(self, done: asyncio.Future[None], durable: int, counted: bool) -> None:
        """The replicas acked a round (in order; a fenced gate fails them all): its
        records are durable."""
        for entry in self._replicating:
            if entry[2] is done:
                self._replicating.remove(entry)
                break
        exc = done.exception()
        if counted:
            self._rounds_finished += 1
        if exc is not None:
            self._fail(exc)
            return
        self._durable_next = max(self._durable_next, durable)

    async def _replicated_round(self, target: int, round_needed: int) -> bool:
        """Wait for the oldest round awaiting its replicas that, once replicated, makes
        offsets below `target` durable and counts as round `round_needed`; False at once
        if there is none (a round must be started)."""
        for durable, number, replicated in self._replicating:
            if durable >= target and number >= round_needed:
                if replicated.done():
                    await asyncio.sleep(0)  # let its callback take it in (see `sync`)
                else:
                    await asyncio.shield(replicated)  # not cancelled with its waiter
                return True
        return False

    def _round_done(self, work: Round, result: RoundResult) -> bool:
        """Take in a round's outcome; True when it did everything it was given."""
        self._companions_left = result.left
        self._companions_stalled = bool(result.left) or work.companions_short
        if result.segments_done:
            self._finish_round(work)
        elif work.fsync_dir:
            self._dir_dirty = True  # skipped with the segments: the next round does it
        # A write may have found the disk full after the round ran: still out of space.
        stalled = self._stalled.error
        if result.segments_done and not self._companions_stalled and stalled is None:
            self._end_space_wait(resumed=True)
            return True
        error = stalled or OutOfSpace(
            errno.ENOSPC, "No space left on device for a companion file's write", self.directory
        )
        self._ran_out_of_space(error)
        return False

    # -- full disk (see `space`) ---------------------------------------------------------

    def _ran_out_of_space(self, error: OutOfSpace) -> None:
        """Writes wait for room: block publishers (through the Syncer's listeners), hold
        every sync, and retry from a timer."""
        space = self._space
        if space is None:
            space = self._space = SpaceWait(self.directory, error)
            self._syncer.space_changed(self.directory, out_of_space=True)
        space.error = error
        if self._inflight is None:
            space.schedule(self._retry_space)

    def _retry_space(self) -> None:
        """The retry timer: a round retries the parked writes and the companion work left
        over, then fsyncs; its outcome ends the wait or schedules the next retry."""
        space = self._space
        if space is None:
            return
        space.timer = None
        if self._failed is None and not self._closed and self._inflight is None:
            self._inflight = self._start_round()

    # -- a round, step by step -----------------------------------------------------------

    def _prepare_round(self) -> Round:
        """Runs on the caller's thread: flush buffers and list what the round must fsync."""
        if self._open_chunk is not None:  # version 2: a round makes whole chunks durable
            self._cut_chunk()
        self._flush(self._active)
        sealing = list(self._unsealed)
        fds = [s.write_fd for s in sealing] + [self._active.write_fd]
        writes = [(s.index_path, s.index_bytes()) for s in sealing]
        fsync_dir = self._dir_dirty or bool(sealing)
        self._dir_dirty = False
        batch = CompanionBatch([], [], [])
        short = False
        for prepare in self._companions:
            try:
                work = prepare()
            except OutOfSpace:
                # A companion that writes on this thread (the definitions) found no
                # room; it keeps its buffer for the next round, which retries it.
                short = True
                continue
            batch.fds.extend(files.dup_fd(fd) for fd in work.fds)
            for fd, data in work.writes:
                duplicate = files.dup_fd(fd)
                batch.fds.append(duplicate)
                batch.writes.append((duplicate, data))
            batch.actions.extend(work.actions)
        # Work a full disk left over goes first, so that each file's writes stay in order.
        left, self._companions_left = self._companions_left, []
        return Round(self._next_offset, fds, [*left, batch], short, sealing, writes, fsync_dir)

    def _run_round(self, work: Round) -> RoundResult:
        """Runs on the Syncer thread, after the writes flushed before the round: segment
        data first, then their index files, then the directory, so that an index on disk
        always describes durable data.

        Writes parked for want of room are retried first; while some still find none, the
        segments are left as they are (neither synced, sealed nor marked durable) and the
        companions' work goes on. Companion work that finds no room is left for the next
        round. Raises on any other error, an fsync's included (which fails the log).
        """
        if self._write_error is not None:
            close_batches(work.companions)
            raise self._write_error
        try:
            segments_ready = self._stalled.retry()
            if segments_ready:
                for fd in work.fds:
                    os.fdatasync(fd)
        except BaseException:
            close_batches(work.companions)
            raise
        left = run_companions(work.companions)
        if not segments_ready or left:
            return RoundResult(False, left)
        try:
            for path, data in work.index_writes:
                write_file_atomic(path, data, fsync_dir=False)
        except OutOfSpace:
            return RoundResult(False, [])  # the segments stay unsealed until there is room
        if work.fsync_dir:
            fsync_directory(self.directory)
        files.pwrite(self._durable_fd, fmt.encode_durable(work.next_offset), 0)
        return RoundResult(True, [])

    def _finish_round(self, work: Round) -> None:
        """A round's fsyncs are done here: its sealed segments are closed for writing.
        Its records become durable in the caller (`_start_round`, `sync_blocking`),
        in a cluster only once the replicas have them too."""
        for segment in work.sealing:
            files.close_fd(segment.write_fd)
            segment.write_fd = -1
            segment.sealed = True
            self._unsealed.remove(segment)
