"""Durable file helpers: atomic replacement and directory fsync.

Owns the write-temp, fsync, rename, fsync-directory sequence (STYLE.md section 6). It knows
nothing of segments or records.
"""

from __future__ import annotations

import errno
import os
from typing import Final

from streamq.log.errors import OutOfSpace

# The errors of a write (never of an fsync) that mean the file system has no room: the
# write can be cut back and tried again once there is.
OUT_OF_SPACE_ERRNOS: Final = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_out_of_space(exc: OSError) -> bool:
    return exc.errno in OUT_OF_SPACE_ERRNOS


def fsync_directory(directory: str) -> None:
    """fsyncs the directory, making creations, renames and deletions in it durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_atomic(path: str, data: bytes, *, fsync_dir: bool) -> None:
    """Replace `path` with `data`: write a temp file, fsync it, rename it over `path`.

    The new contents are durable before returning; the rename is durable before returning
    only with fsync_dir=True (callers that write several files fsync the directory once).
    Raises OutOfSpace, with the temp file removed and `path` untouched, when the file
    system has no room for the data (the call can be repeated once it has).
    """
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            write_all(fd, data)
        except OSError as exc:
            if not is_out_of_space(exc):
                raise
            os.remove(tmp)  # give its blocks back
            raise OutOfSpace(exc.errno, exc.strerror, tmp) from exc
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if fsync_dir:
        fsync_directory(os.path.dirname(path) or ".")


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """Write every byte of `data` to `fd` (buffered in the OS; durable after an fsync)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def append_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """Write every byte of `data` at the end of `fd`, a file opened with O_APPEND that no
    one else writes meanwhile (buffered in the OS; durable after an fsync).

    Raises OutOfSpace when the file system has no room, after cutting the file back to
    its size before the call: the call can be repeated once there is room.
    """
    view = memoryview(data)
    written = 0
    try:
        while written < len(view):
            written += os.write(fd, view[written:])
    except OSError as exc:
        if not is_out_of_space(exc):
            raise
        if written:
            os.ftruncate(fd, os.fstat(fd).st_size - written)
        raise OutOfSpace(exc.errno, exc.strerror) from exc
