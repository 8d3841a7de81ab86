"""Durable file helpers, and the one door every change under a data directory goes through.

Owns the write-temp, fsync, rename, fsync-directory sequence (STYLE.md section 6), and the
wrappers of the system calls that change files (`open_fd`, `pwrite`, `write`, `ftruncate`,
`replace`, `remove`, `remove_tree`, `makedirs`): each makes its call, then records what it
did on the process-wide file tap when one is set (a cluster leader's, see `tap`). Without
a tap they cost one attribute read more than the bare call. It knows nothing of segments
or records.

The tap wants paths, the calls have descriptors: `open_fd` remembers each descriptor's
path (absolute), `dup_fd` its duplicates', `replace` moves them with their file, and
`close_fd` forgets them. A descriptor opened otherwise writes unrecorded, so every
descriptor that writes under a data directory comes from `open_fd` or `dup_fd`.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import sys
from collections.abc import Callable
from typing import Final

from streamq.log.errors import OutOfSpace
from streamq.log.tap import current

# Descriptor -> absolute path of the file it writes, for the tap. Single dict operations
# are atomic under the GIL; a descriptor is used by one thread at a time.
_paths: dict[int, str] = {}


def open_fd(path: str, flags: int, mode: int = 0o644) -> int:
    """os.open, remembering the path for the tap. An open that truncates, or creates,
    is recorded as a truncate to 0 (which creates the file on a follower). An O_CREAT
    open that found the file with bytes in it records nothing: the file is already on
    every follower in sync, and a truncate to the size seen here could be recorded after
    another thread's append to it. Close with `close_fd`."""
    fd = os.open(path, flags, mode)
    full = _paths[fd] = os.path.abspath(path)
    tap = current.tap
    if tap is not None and (
        flags & os.O_TRUNC or (flags & os.O_CREAT and os.fstat(fd).st_size == 0)
    ):
        tap.truncate(full, 0)
    return fd


def dup_fd(fd: int) -> int:
    """os.dup of a descriptor from `open_fd`, writing to the same path."""
    duplicate = os.dup(fd)
    path = _paths.get(fd)
    if path is not None:
        _paths[duplicate] = path
    return duplicate


def close_fd(fd: int) -> None:
    _paths.pop(fd, None)
    os.close(fd)


def pwrite(fd: int, data: bytes | bytearray | memoryview, position: int) -> int:
    """os.pwrite, recorded (what was written: a short write records its part)."""
    written = os.pwrite(fd, data, position)
    tap = current.tap
    if tap is not None and (path := _paths.get(fd)) is not None:
        tap.write(path, position, memoryview(data)[:written])
    return written


def write(fd: int, data: bytes | bytearray | memoryview) -> int:
    """os.write at the descriptor's offset (O_APPEND: the end), recorded where it landed."""
    written = os.write(fd, data)
    tap = current.tap
    if tap is not None and (path := _paths.get(fd)) is not None:
        end = os.lseek(fd, 0, os.SEEK_CUR)
        tap.write(path, end - written, memoryview(data)[:written])
    return written


def ftruncate(fd: int, size: int) -> None:
    os.ftruncate(fd, size)
    tap = current.tap
    if tap is not None and (path := _paths.get(fd)) is not None:
        tap.truncate(path, size)


def replace(src: str, dst: str) -> None:
    """os.replace, recorded; descriptors of `src` (or of files under it, for a directory)
    now write to `dst`, those of the file `dst` was are no longer recorded (on this node
    that file is gone)."""
    os.replace(src, dst)
    source, target = os.path.abspath(src), os.path.abspath(dst)
    inside = source + "/"  # a renamed directory takes the files under it along
    for fd, path in list(_paths.items()):
        if path == target:
            _paths.pop(fd, None)
        elif (path == source or path.startswith(inside)) and _paths.get(fd) == path:
            _paths[fd] = target + path[len(source) :]  # unless closed meanwhile
    tap = current.tap
    if tap is not None:
        tap.rename(source, target)


def remove(path: str) -> None:
    """os.remove, recorded. Raises FileNotFoundError as os.remove does."""
    os.remove(path)
    tap = current.tap
    if tap is not None:
        tap.remove(path)


def remove_tree(path: str) -> None:
    """Remove a directory and everything under it; missing is fine. Recorded even when
    part of it could not be removed (then the OSError is raised): what did go is gone."""
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        pass
    finally:
        tap = current.tap
        if tap is not None:
            tap.remove_tree(path)


def makedirs(path: str) -> None:
    """os.makedirs(exist_ok=True), recorded."""
    os.makedirs(path, exist_ok=True)
    tap = current.tap
    if tap is not None:
        tap.mkdir(path)


# The errors of a write (never of an fsync) that mean the file system has no room: the
# write can be cut back and tried again once there is.
OUT_OF_SPACE_ERRNOS: Final = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_out_of_space(exc: OSError) -> bool:
    return exc.errno in OUT_OF_SPACE_ERRNOS


# sync_file_range(2)'s flag that starts write-back of dirty pages without waiting for it.
_SYNC_FILE_RANGE_WRITE: Final = 2


def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """libc's sync_file_range, or None where there is none (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    function = getattr(ctypes.CDLL(None, use_errno=True), "sync_file_range", None)
    if function is not None:
        function.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
        function.restype = ctypes.c_int
    return function


_sync_range = _sync_file_range()


def start_writeback(fd: int, offset: int, length: int) -> bool:
    """Ask the kernel to start writing `length` bytes of `fd` from `offset` to the device
    now, without waiting (sync_file_range with SYNC_FILE_RANGE_WRITE). The pages stay in
    the page cache, clean once written, so readers right behind still read from memory,
    and the next fdatasync finds little left to write. Durability is not changed: only an
    fdatasync makes the range durable. Returns False where the call is missing or the
    file system refuses it (the write-back then starts when the kernel chooses)."""
    if _sync_range is None:
        return False
    return bool(_sync_range(fd, offset, length, _SYNC_FILE_RANGE_WRITE) == 0)


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
    try:
        fd = open_fd(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    except OSError as exc:
        if not is_out_of_space(exc):
            raise
        raise OutOfSpace(exc.errno, exc.strerror, tmp) from exc
    try:
        try:
            write_all(fd, data)
            os.fsync(fd)  # ENOSPC here too on some file systems: only the temp file is lost
        except OSError as exc:
            if not is_out_of_space(exc):
                raise
            remove(tmp)  # give its blocks back
            raise OutOfSpace(exc.errno, exc.strerror, tmp) from exc
    finally:
        close_fd(fd)
    replace(tmp, path)
    if fsync_dir:
        fsync_directory(os.path.dirname(path) or ".")


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """Write every byte of `data` to `fd` (buffered in the OS; durable after an fsync)."""
    view = memoryview(data)
    while view:
        view = view[write(fd, view) :]


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
            written += write(fd, view[written:])
    except OSError as exc:
        if not is_out_of_space(exc):
            raise
        if written:
            ftruncate(fd, os.fstat(fd).st_size - written)
        raise OutOfSpace(exc.errno, exc.strerror) from exc
