"""The pidfile of `streamq serve --pidfile FILE` (LavinMQ's flag): this process's id, for
init systems and scripts.

Owns the file's life: written once the data directory is locked (the lock, not this file,
keeps two brokers off one directory), removed at a clean shutdown if it still names this
process. A file that names another running process is refused rather than overwritten.
"""

from __future__ import annotations

import contextlib
import os
from typing import Final

PIDFILE_BYTES_MAX: Final = 32


class PidfileError(Exception):
    """The pidfile cannot be written, or names another running process."""


def write_pidfile(path: str) -> None:
    """Write this process's id to `path` (LavinMQ's --pidfile), replacing a stale one.

    Fsyncs nothing: a pidfile is only for the running process. Raises PidfileError if it
    cannot be written or names another running process.
    """
    try:
        with open(path, "rb") as file:
            held = int(file.read(PIDFILE_BYTES_MAX).strip() or b"0")
    except (OSError, ValueError):
        held = 0
    if held not in (0, os.getpid()) and _running(held):
        raise PidfileError(f"pidfile {path} names a running process (pid {held})")
    try:
        with open(path, "w", encoding="ascii") as file:
            file.write(f"{os.getpid()}\n")
    except OSError as exc:
        raise PidfileError(f"cannot write the pidfile {path}: {exc.strerror}") from exc


def remove_pidfile(path: str) -> None:
    """Remove `path` if it still names this process."""
    with contextlib.suppress(OSError, ValueError), open(path, "rb") as file:
        if int(file.read(PIDFILE_BYTES_MAX).strip()) != os.getpid():
            return
    with contextlib.suppress(OSError):
        os.unlink(path)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True
