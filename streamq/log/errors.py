"""Errors raised by the segment log. Domain terms only: the gateways map them to codes."""

from __future__ import annotations

import os


class LogError(Exception):
    """Base class of every error the segment log raises."""


class SegmentCorrupted(LogError):
    """Data on disk failed an integrity check (magic, version, length, CRC or offset)."""

    def __init__(self, path: str, position: int, reason: str) -> None:
        super().__init__(f"{path} at position {position}: {reason}")
        self.path = path
        self.position = position
        self.reason = reason


class RecordDamaged(SegmentCorrupted):
    """The record asked for was lost to damage on disk (bit rot): it is skipped, never
    delivered, and the log goes on (`streamq.log.damage`). Carries the damaged span's
    first offset, the offset after it and the bodies' size lost (an estimate when the
    damage hit record headers)."""

    def __init__(
        self, path: str, position: int, first_offset: int, end_offset: int, body_bytes: int
    ) -> None:
        super().__init__(path, position, f"records {first_offset} to {end_offset - 1} are damaged")
        self.first_offset = first_offset
        self.end_offset = end_offset
        self.body_bytes = body_bytes


class LogFailed(LogError):
    """The log hit corrupt data or an I/O error earlier and refuses further work.

    Only this log is failed; other logs in the same process keep working.
    """

    def __init__(self, directory: str, cause: BaseException) -> None:
        super().__init__(f"log {directory} has failed: {cause}")
        self.directory = directory
        self.cause = cause


class OutOfSpace(LogError, OSError):
    """A write found the file system full (ENOSPC, EDQUOT, or a direct write that stopped
    short) before anything of it was fsynced. Nothing is lost: what was partly written was
    cut back, and the write can be tried again once there is room (`SegmentLog` does, in
    order). An OSError too, with the errno met, for callers that catch those."""


class LogClosed(LogError):
    """The log was closed."""


class OffsetOutOfRange(LogError):
    """The offset asked for is before the log's first retained offset."""

    def __init__(self, offset: int, start_offset: int) -> None:
        super().__init__(f"offset {offset} is before the first retained offset {start_offset}")
        self.offset = offset
        self.start_offset = start_offset


class RecordTooLarge(LogError):
    """A message is larger than the log accepts (`record_bytes_max`)."""


class ReplicationFenced(LogError):
    """This node is no longer the cluster leader: a round it held for its followers will
    never be confirmed by it (another leader may hold, or have dropped, its writes)."""

    def __init__(self, reason: str = "this node is no longer the cluster leader") -> None:
        super().__init__(reason)


def fenced(exc: BaseException) -> bool:
    """The error says this node stepped down as cluster leader: an awaited round raises
    ReplicationFenced itself, a later use of its log the LogFailed that wraps it."""
    return isinstance(exc, ReplicationFenced) or (
        isinstance(exc, LogFailed) and isinstance(exc.cause, ReplicationFenced)
    )


class ReadFailed(LogError):
    """Reading a segment failed with an I/O error (EIO): that read fails, the log goes on
    (a failed read changes nothing on disk; the next read may work)."""

    def __init__(self, path: str, position: int, cause: OSError) -> None:
        # The file by name: the text goes into AMQP replies (255 bytes at most).
        name = os.path.basename(path)
        super().__init__(f"reading segment {name} at position {position} failed: {cause}")
        self.path = path
        self.position = position
        self.cause = cause
