"""Segment writes with direct I/O, on the Syncer thread.

Owns how appended bytes reach a segment file. The event loop never writes segment data:
it hands full write buffers to the Syncer thread (`SegmentLog._flush`), which writes them
here, in order, before any fsync round submitted after them.

Direct I/O (O_DIRECT) moves the bytes from memory to the device without copying them into
the page cache. On the VMs we run on that copy was the largest single cost of large
publishes: 43-50% of the broker's time at 64 KiB bodies went to the kernel filling fresh
page cache pages (docs/perf.md, "Direct I/O segment writes"), and a buffered write with
fdatasync moved 373 MB/s where direct writes of 1 MiB move 2.0-2.4 GB/s.

Direct I/O wants the memory, the file position and the length aligned to the device's
blocks. Records are not, so each write starts at the block holding the segment's end: the
bytes of that partial block (kept in `tail`) are written again, followed by the new data,
and the last block is padded with zeros. The file therefore ends with up to one block of
zeros past its logical end while it is being written; `finish` cuts them when the segment
is sealed or closed. A crash leaves them, and recovery cuts them as it cuts any torn tail
(a zero record length is never valid). Readers never see them: they read only below the
durable offset.

On a cluster leader the file tap (see `tap`) records each write as its logical bytes at
their logical position, and a cut as a truncate to the logical end: followers never see
the padding (a sealed or cleanly closed segment is byte for byte the leader's; an open
one lacks only the zeros).

A file system that refuses O_DIRECT (EINVAL at open, or at the first direct write of a
`write`, before any of it landed) gets plain positional writes.

A write that finds the file system full (ENOSPC, EDQUOT, or a direct write that stops
short, which is how a full disk answers O_DIRECT) leaves the writer as it was before the
write: the file is cut back to the logical end, giving back any block the write took, and
OutOfSpace is raised. Nothing of the write was fsynced, so the same write can be made
again later, at the same position (the log does, see `SegmentLog`).
"""

from __future__ import annotations

import errno
import mmap
import os
from typing import Final

from streamq.log.errors import LogError, OutOfSpace
from streamq.log.files import is_out_of_space, start_writeback
from streamq.log.tap import current

BLOCK_BYTES: Final = 4096  # alignment of direct I/O: covers 512-byte and 4 KiB devices
# The aligned buffer a direct write is assembled in: a 4 MiB write buffer and the block
# in front of it fit in one write.
STAGING_BYTES: Final = 8 << 20
_ZEROS: Final = bytes(BLOCK_BYTES)
_O_DIRECT: Final = getattr(os, "O_DIRECT", 0)  # Linux; elsewhere plain writes


def staging_buffer() -> mmap.mmap:
    """An aligned buffer for `SegmentWriter.write` (anonymous memory is page-aligned). One
    per Syncer thread: writes never share it concurrently."""
    return mmap.mmap(-1, STAGING_BYTES)


class _Refused(Exception):
    """The first direct write of a `write` got EINVAL: nothing of it reached the file."""


class SegmentWriter:
    """Writes one segment's appended bytes at its end.

    Opened on the caller's thread, so that the file is the one at `path` then (a log
    deleted and created again at the same path cannot receive the old one's writes); used
    only on the Syncer thread afterwards.
    """

    __slots__ = ("_first", "block_start", "direct", "end", "fd", "path", "tail", "write_behind")

    def __init__(self, path: str, end: int, *, direct: bool, write_behind: bool = False) -> None:
        """Open the segment at `path`, whose bytes up to `end` are written (by a buffered
        write or before a restart). With `write_behind`, each plain write starts its own
        write-back at once (`files.start_writeback`). Raises OSError."""
        self.path = path
        self.direct = direct
        self.write_behind = write_behind
        self.end = end  # the logical end: where the next write must start
        self.block_start = end - end % BLOCK_BYTES  # file position of the block holding `end`
        self.tail = b""  # the bytes from `block_start` to `end`
        self._first = True  # no direct write of the current `write` has landed yet
        self.fd = self._open()

    def write(self, position: int, data: bytes | bytearray, staging: mmap.mmap) -> None:
        """Write `data` at `position`, the segment's current end. Raises OutOfSpace when
        the file system is full (the writer and the file are then as before the call, and
        the call may be repeated), other OSErrors, and LogError when `position` is not where
        the previous write ended (a broken caller)."""
        if self.fd < 0:
            raise LogError(f"{self.path}: write after finish")
        if position != self.end:
            raise LogError(f"{self.path}: write at {position}, but the segment ends at {self.end}")
        block_start, tail = self.block_start, self.tail
        try:
            self._write(position, data, staging)
        except OSError as exc:
            if not is_out_of_space(exc):
                raise
            self.block_start, self.tail = block_start, tail
            # Nothing past `end` was fsynced: cut what this write left there (whole
            # blocks, or a direct write's padding), so that its blocks go back to the
            # file system and the file ends where the retry will start.
            self._truncate(self.end)
            raise OutOfSpace(exc.errno, exc.strerror, self.path) from exc
        self.end = position + len(data)
        tap = current.tap
        if tap is not None:
            tap.write(self.path, position, data)

    def _write(self, position: int, data: bytes | bytearray, staging: mmap.mmap) -> None:
        if self.direct:
            try:
                self._write_direct(data, staging)
            except _Refused:
                # The file system took O_DIRECT at open but refuses these writes (its
                # alignment is not ours): plain writes from here on, nothing was written.
                os.close(self.fd)
                self.fd = os.open(self.path, os.O_WRONLY)
                self.direct = False
        if not self.direct:
            view = memoryview(data)
            at = position
            while view:
                written = os.pwrite(self.fd, view, at)
                view = view[written:]
                at += written
            if self.write_behind:
                start_writeback(self.fd, position, len(data))

    def finish(self, *, cut_padding: bool) -> None:
        """Close the file; with cut_padding, first cut the zeros past the logical end (the
        cut is durable after the next fdatasync of the file)."""
        if self.fd < 0:
            return
        try:
            if cut_padding:
                self._truncate(self.end)  # also after a fall back to plain writes
        finally:
            os.close(self.fd)
            self.fd = -1

    def _truncate(self, size: int) -> None:
        os.ftruncate(self.fd, size)
        tap = current.tap
        if tap is not None:
            tap.truncate(self.path, size)

    def _open(self) -> int:
        if self.direct:
            reader = os.open(self.path, os.O_RDONLY)
            try:
                self.tail = os.pread(reader, self.end - self.block_start, self.block_start)
            finally:
                os.close(reader)
            if len(self.tail) != self.end - self.block_start:
                raise OSError(errno.EIO, f"{self.path}: shorter than its end at {self.end}")
            if _O_DIRECT:
                try:
                    return os.open(self.path, os.O_WRONLY | _O_DIRECT)
                except OSError as exc:
                    if exc.errno != errno.EINVAL:
                        raise
            self.direct = False  # no direct I/O on this file system or platform
        return os.open(self.path, os.O_WRONLY)

    def _write_direct(self, data: bytes | bytearray, staging: mmap.mmap) -> None:
        """Assemble tail + data in `staging`, write whole blocks, keep the new tail."""
        capacity = len(staging)
        view = memoryview(data)
        size = len(view)
        filled = len(self.tail)
        staging[:filled] = self.tail
        done = 0
        self._first = True
        while True:
            take = min(size - done, capacity - filled)
            staging[filled : filled + take] = view[done : done + take]
            filled += take
            done += take
            if done == size:
                break
            self._pwrite_all(staging, capacity)  # a full staging buffer: whole blocks
            self.block_start += capacity
            filled = 0
        whole = filled - filled % BLOCK_BYTES
        padded = whole + BLOCK_BYTES if filled > whole else whole
        staging[filled:padded] = _ZEROS[: padded - filled]
        self._pwrite_all(staging, padded)
        self.tail = staging[whole:filled]
        self.block_start += whole

    def _pwrite_all(self, staging: mmap.mmap, length: int) -> None:
        try:
            with memoryview(staging) as view:
                written = os.pwrite(self.fd, view[:length], self.block_start)
        except OSError as exc:
            if exc.errno == errno.EINVAL and self._first:
                raise _Refused from exc
            raise
        self._first = False
        if written != length:
            # A direct write that stops short cannot go on unaligned. On a regular file it
            # stops short when the file system is full (the next write would get ENOSPC),
            # so it is reported as that: the caller cuts it back and retries it later.
            raise OSError(
                errno.ENOSPC,
                f"No space left on device (a direct write stopped at {written} of {length} bytes)",
                self.path,
            )
