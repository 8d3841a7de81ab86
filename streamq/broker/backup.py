"""Online backups: a consistent copy of a running broker's data directory.

Owns the broker's half of `streamq ctl backup DIR` (`POST /api/backup`): one backup at a
time, taken without stopping or pausing anything, by the method a cluster follower's full
sync uses (docs/clustering.md):

1. A `BackupTap` is installed as the process-wide file tap (`streamq.log.tap`; on a
   cluster leader it wraps the leader's tap, which keeps receiving everything). From then
   on every change made under the data directory is recorded, in order.
2. The tree is copied (`backup_files.TreeCopier`: sealed segments hard-linked on the same
   file system), in a worker thread, while the tap is drained into a spool file in DIR.
3. The *sync point*: every log of every vhost (the message log, each stream's) runs a
   sync round with its companions (queue journals, definitions, delayed messages, stream
   offsets, publishers), so that what the broker did before (acks, stored offsets) is
   written; then, on the event loop with no await between, the tap's position is read and
   the tap taken out. A second round per log then fsyncs every byte written before it.
4. The spool, up to the sync point, is replayed over the copy (`SnapshotApplier`), the
   copy fsynced, and the manifest written last.

The result is the data directory exactly as it was at the sync point, every byte of it
fsynced: what a crash right after that point would have left had every write reached the
disk. Everything the broker did before the request arrived is in it: every message
confirmed, every ack it processed (a `tx.commit-ok` sent, or any reply on the channel
after the ack), every declare, policy, user and stored offset. Changes after the sync
point are not; those between the request and the sync point may or may not be. It never
writes under the data directory, and never blocks the event loop on a disk.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from streamq import __version__
from streamq.broker.backup_files import (
    MANIFEST_FORMAT,
    MANIFEST_VERSION,
    BackupFailed,
    BackupRefused,
    CopyCounts,
    SnapshotApplier,
    TreeCopier,
    check_target,
    create_target,
    empty_target,
    finish,
    manifest_counts,
)
from streamq.broker.broker import Broker
from streamq.log.errors import LogError, OutOfSpace
from streamq.log.log import SegmentLog
from streamq.log.tap import FileTap, TapTrimmed, get_tap, set_tap

logger = logging.getLogger(__name__)

SPOOL: Final = ".streamq-backup-actions"  # in DIR while the backup runs; removed after
SPOOL_READ_BYTES: Final = 4 << 20
# Changes recorded and not yet drained into the spool, at most (the drain runs after each
# 4 MiB copied); past it the backup fails rather than hold more memory.
TAP_RETAIN_BYTES_MAX: Final = 256 << 20
# How long the sync point's rounds may take (a log out of disk space waits for room).
SYNC_TIMEOUT_S: Final = 60.0


@dataclass(frozen=True, slots=True)
class BackupReport:
    """What a backup did, as the API answers it and the manifest records it."""

    directory: str
    data_dir: str
    started_ms: int
    sync_point_ms: int
    finished_ms: int
    counts: CopyCounts
    replayed_bytes: int
    logs_synced: int
    vhosts: tuple[str, ...]

    def as_json(self) -> dict[str, object]:
        return {
            "format": MANIFEST_FORMAT,
            "version": MANIFEST_VERSION,
            "streamq_version": __version__,
            "directory": self.directory,
            "data_dir": self.data_dir,
            "started_ms": self.started_ms,
            "sync_point_ms": self.sync_point_ms,
            "finished_ms": self.finished_ms,
            "replayed_bytes": self.replayed_bytes,
            "logs_synced": self.logs_synced,
            "online": True,
            "vhosts": list(self.vhosts),
            **manifest_counts(self.counts),
        }


class BackupTap(FileTap):
    """The tap of a backup: records every change, and passes it on to the tap it
    replaced (a cluster leader's), so that replication sees nothing different."""

    def __init__(self, root: str, inner: FileTap | None) -> None:
        super().__init__(root, retain_bytes_max=TAP_RETAIN_BYTES_MAX)
        self.inner = inner

    def write(self, path: str, position: int, data: bytes | bytearray | memoryview) -> None:
        super().write(path, position, data)
        if self.inner is not None:
            self.inner.write(path, position, data)

    def truncate(self, path: str, size: int) -> None:
        super().truncate(path, size)
        if self.inner is not None:
            self.inner.truncate(path, size)

    def rename(self, src: str, dst: str) -> None:
        super().rename(src, dst)
        if self.inner is not None:
            self.inner.rename(src, dst)

    def remove(self, path: str) -> None:
        super().remove(path)
        if self.inner is not None:
            self.inner.remove(path)

    def remove_tree(self, path: str) -> None:
        super().remove_tree(path)
        if self.inner is not None:
            self.inner.remove_tree(path)

    def mkdir(self, path: str) -> None:
        super().mkdir(path)
        if self.inner is not None:
            self.inner.mkdir(path)


class Spool:
    """The changes recorded during a backup, moved from the tap to a file in DIR (so that
    memory holds at most what one drain leaves). Drained from worker threads, one at a
    time."""

    def __init__(self, tap: BackupTap, target: str) -> None:
        self.tap = tap
        self.path = os.path.join(target, SPOOL)
        self.position = tap.first_retained  # the next stream byte to move
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)

    def drain(self, end: int | None = None) -> None:
        """Move what the tap holds (up to stream position `end`) into the file. Raises
        BackupFailed when the tap had to drop changes not yet moved."""
        while end is None or self.position < end:
            limit = SPOOL_READ_BYTES if end is None else min(SPOOL_READ_BYTES, end - self.position)
            try:
                data = self.tap.read(self.position, limit)
            except TapTrimmed:
                raise BackupFailed(
                    f"more than {TAP_RETAIN_BYTES_MAX >> 20} MiB changed in the data "
                    "directory between two steps of the copy; try the backup again"
                ) from None
            if not data:
                break
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
            self.position += len(data)
            self.tap.trim(self.position)

    def replay(self, applier: SnapshotApplier) -> int:
        """Apply the spooled changes to the copy (durable after `applier.sync()`); the
        bytes replayed."""
        os.close(self._fd)
        self._fd = -1
        total = 0
        with open(self.path, "rb") as spooled:
            while chunk := spooled.read(SPOOL_READ_BYTES):
                applier.feed(chunk)
                total += len(chunk)
        os.remove(self.path)
        return total

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class Backups:
    """Backups, one at a time in a process: the file tap they install is process-wide."""

    def __init__(self) -> None:
        self.running: str | None = None  # the target of the backup under way

    async def take(self, broker: Broker, target: str, *, links: bool) -> BackupReport:
        """Back the data directory up into `target` (absolute; empty or missing).

        Raises BackupRefused (nothing done: a bad target, a backup already running) and
        BackupFailed (the target emptied again: the node stepped down, too many changes,
        a log that could not sync). Complete and durable on return. A caller that goes
        away (the HTTP client disconnects) does not stop it."""
        if self.running is not None:
            raise BackupRefused(f"a backup into {self.running} is already running")
        must_create = check_target(broker.data_dir, target)
        self.running = target
        task = asyncio.ensure_future(self._take(broker, target, must_create, links))
        task.add_done_callback(self._done)
        return await asyncio.shield(task)

    def _done(self, task: asyncio.Future[BackupReport]) -> None:
        target, self.running = self.running, None
        if not task.cancelled() and (exc := task.exception()) is not None:
            logger.error("backup into %s failed: %s", target, exc)

    async def _take(
        self, broker: Broker, target: str, must_create: bool, links: bool
    ) -> BackupReport:
        started_ms = _now_ms()
        data_dir = broker.data_dir
        if must_create:
            await asyncio.to_thread(create_target, target)
        try:
            spool = await asyncio.to_thread(Spool, BackupTap(data_dir, get_tap()), target)
            try:
                return await _copy(broker, spool, target, links, started_ms)
            finally:
                spool.close()
        except BaseException:
            await asyncio.to_thread(empty_target, target, created=must_create)
            raise


async def _copy(
    broker: Broker, spool: Spool, target: str, links: bool, started_ms: int
) -> BackupReport:
    data_dir = os.path.abspath(broker.data_dir)
    copier = TreeCopier(data_dir, target, links=links, between=spool.drain)
    sync_point = await _copy_until_sync_point(broker, spool, copier)
    sync_point_ms = _now_ms()
    # Every byte recorded before the sync point is fsynced by a round that began after it.
    logs_synced = await _sync_logs(broker)
    await asyncio.to_thread(spool.drain, sync_point)
    applier = SnapshotApplier(target, copier.linked, copier.counts)
    replayed = await asyncio.to_thread(_replay, spool, applier)
    report = BackupReport(target, data_dir, started_ms, sync_point_ms, _now_ms(),
                          copier.counts, replayed, logs_synced,
                          tuple(sorted(broker.vhosts)))  # fmt: skip
    await asyncio.to_thread(finish, target, report.as_json())
    counts = copier.counts
    logger.info("backup of %s into %s: %d files copied (%d bytes), %d hard-linked, "
                "%d bytes of changes replayed", data_dir, target, counts.files_copied,
                counts.bytes_copied, counts.files_linked, replayed)  # fmt: skip
    return report


async def _copy_until_sync_point(broker: Broker, spool: Spool, copier: TreeCopier) -> int:
    """Install the tap, copy the tree, make durable what the broker did before now
    (acks, stored offsets and other companion writes are written by a round), then read
    the sync point and take the tap out, with no await between. Returns the sync point."""
    tap = spool.tap
    if get_tap() is not tap.inner:  # a leadership change since the tap was made
        raise BackupFailed("the node's role changed as the backup began; try again")
    set_tap(tap)
    try:
        await asyncio.to_thread(copier.run)
        await _sync_logs(broker, warn=True)
    finally:
        sync_point = tap.position
        replaced = get_tap() is not tap
        if not replaced:
            set_tap(tap.inner)
    if replaced:
        raise BackupFailed("the node's role changed during the backup (a cluster leader "
                           "stepped down); try again")  # fmt: skip
    return sync_point


def _replay(spool: Spool, applier: SnapshotApplier) -> int:
    try:
        replayed = spool.replay(applier)
        applier.sync()
        return replayed
    finally:
        applier.close()


def _logs(broker: Broker) -> Iterator[tuple[str, SegmentLog]]:
    """Every open log: each vhost's message log and its streams' logs."""
    for name, vhost in list(broker.vhosts.items()):
        yield name, vhost.log
        for queue in list(vhost.queues.values()):
            if queue.stream is not None:
                yield f"{name}/{queue.name}", queue.stream.log


async def _sync_logs(broker: Broker, *, warn: bool = False) -> int:
    """Make every byte written so far durable: one round (with companions) per log.

    A failed log (a failed fsync: its vhost or stream is unavailable) is skipped with a
    warning: its files are copied as they are, as a crash would leave them. Raises
    BackupFailed when a log cannot sync within SYNC_TIMEOUT_S (out of disk space)."""
    logs = list(_logs(broker))
    for where, log in logs:
        if warn and log.failed is not None:
            logger.warning("backup: log of %s has failed (%s); copied as it is", where, log.failed)
    live = [(where, log) for where, log in logs if log.failed is None]
    try:
        async with asyncio.timeout(SYNC_TIMEOUT_S):
            await asyncio.gather(*(log.sync(companions=True) for _where, log in live))
    except TimeoutError:
        raise BackupFailed(
            f"the logs did not sync within {SYNC_TIMEOUT_S:g} s (out of disk space?)"
        ) from None
    except (LogError, OutOfSpace) as exc:
        raise BackupFailed(f"a log failed to sync at the sync point: {exc}") from None
    return len(live)


def _now_ms() -> int:
    return int(time.time() * 1000)
