"""Durable file helpers: atomic replacement and directory fsync.

Owns the write-temp, fsync, rename, fsync-directory sequence (STYLE.md section 6). It knows
nothing of segments or records.
"""

from __future__ import annotations

import os


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
    """
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
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
