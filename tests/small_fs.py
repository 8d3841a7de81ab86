"""A small file system for tests of a full disk: a tmpfs of a given size, mounted for the
test and unmounted after it. Mounting needs root, which CI has; without it the test fails
with the reason rather than being skipped (a full disk must stay tested)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

MOUNT_TIMEOUT_S = 10


@contextlib.contextmanager
def small_filesystem(path: Path, size: str) -> Iterator[Path]:
    """Mount a tmpfs of `size` (`80m`) at `path` (created) for the `with` block."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
        capture_output=True,
        timeout=MOUNT_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(
            f"mounting a {size} tmpfs at {path} failed (these tests need root, as CI has): "
            f"{done.stderr.decode(errors='replace')}"
        )
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], timeout=MOUNT_TIMEOUT_S, check=True)


def fill(path: Path, leave_bytes: int) -> Path:
    """Create the file `path` taking all the room of its file system but `leave_bytes`."""
    stats = os.statvfs(path.parent)
    size = max(stats.f_bavail * stats.f_frsize - leave_bytes, 0)
    with open(path, "wb") as file:
        chunk = bytes(1 << 20)
        while size > 0:
            size -= file.write(chunk[: min(size, len(chunk))])
    return path


def free_bytes(path: Path) -> int:
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize
