"""SHA-1s of a data directory's files, cached so that a full sync hashes only what changed.

A full sync compares every file of the leader's data directory with the follower's by
size and SHA-1 (`streamq.cluster.sync`). Hashing everything on every reconnect costs as
long as reading the whole directory twice (once on each side): minutes for many GB.
Sealed segments, most of the bytes, never change, so each node keeps the SHA-1 of every
file it hashed with the file's stamp (size, mtime, ctime, inode) and hashes a file again
only when its stamp moved, as LavinMQ 2.5 keeps its checksums.

A stamp is only trusted for a file that had not been modified for RACY_NS when it was
hashed: a write in the same clock tick as the hash may leave mtime and ctime where they
were (git's "racy" entries), so such a file is hashed again next time. Every write
changes ctime, a replace changes the inode, an append the size.

The cache lives in the node's own `checksums.sha1` (one of the tap's LOCAL_FILES: never
replicated), written whole through a temporary file and a rename after each listing, not
fsynced: a lost or stale cache only costs hashing. One line per file:
`<sha1 hex> <size> <mtime_ns> <ctime_ns> <inode> <relative path>`.
Blocking file I/O only, any thread (a lock guards the table).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Final

logger = logging.getLogger(__name__)

CACHE_FILE: Final = "checksums.sha1"
HASH_CHUNK_BYTES: Final = 1 << 20
RACY_NS: Final = 2_000_000_000  # a file modified within 2 s of its hash is hashed again
SHA1_HEX_LEN: Final = 40


@dataclass(frozen=True, slots=True)
class Stamp:
    size: int
    mtime_ns: int
    ctime_ns: int
    inode: int

    @classmethod
    def of(cls, stat: os.stat_result) -> Stamp:
        return cls(stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino)


def file_sha1(path: str, size: int | None = None) -> bytes:
    """SHA-1 of the first `size` bytes of the file (all of it with None)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return fd_sha1(fd, os.fstat(fd).st_size if size is None else size)
    finally:
        os.close(fd)


def fd_sha1(fd: int, size: int) -> bytes:
    """SHA-1 of the first `size` bytes of an open file (fewer if it is shorter)."""
    digest = hashlib.sha1(usedforsecurity=False)
    position = 0
    while position < size:
        chunk = os.pread(fd, min(size - position, HASH_CHUNK_BYTES), position)
        if not chunk:
            break
        digest.update(chunk)
        position += len(chunk)
    return digest.digest()


class ChecksumCache:
    """The cached SHA-1s of the files under `root`; `hashed` counts the files it had to
    read (what a listing cost), `reused` those it answered from the cache."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.hashed = 0
        self.reused = 0
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[Stamp, bytes]] = _load(os.path.join(root, CACHE_FILE))

    def sha1(self, relative: str) -> tuple[int, bytes]:
        """(size, SHA-1) of the whole file at `relative` now, from the cache when its
        stamp has not moved. Raises OSError (FileNotFoundError when it is gone)."""
        full = os.path.join(self.root, relative)
        fd = os.open(full, os.O_RDONLY)
        try:
            stamp = Stamp.of(os.fstat(fd))
            with self._lock:
                cached = self._entries.get(relative)
            if cached is not None and cached[0] == stamp:
                self.reused += 1
                return stamp.size, cached[1]
            digest = fd_sha1(fd, stamp.size)
            after = Stamp.of(os.fstat(fd))
        finally:
            os.close(fd)
        self.hashed += 1
        if after == stamp and time.time_ns() - stamp.mtime_ns > RACY_NS:
            with self._lock:
                self._entries[relative] = (stamp, digest)
        return stamp.size, digest

    def keep_only(self, relatives: set[str]) -> None:
        """Forget the files not in `relatives` (removed since)."""
        with self._lock:
            for relative in [r for r in self._entries if r not in relatives]:
                del self._entries[relative]

    def save(self) -> None:
        """Writes the cache file (temporary file and rename; not fsynced: see above).
        A failure is logged and otherwise ignored: the cache is an optimisation."""
        with self._lock:
            lines = [
                f"{sha1.hex()} {s.size} {s.mtime_ns} {s.ctime_ns} {s.inode} {relative}\n"
                for relative, (s, sha1) in sorted(self._entries.items())
            ]
        path = os.path.join(self.root, CACHE_FILE)
        temporary = path + ".tmp"
        try:
            with open(temporary, "w", encoding="utf-8") as out:
                out.writelines(lines)
            os.replace(temporary, path)
        except OSError as exc:
            logger.warning("clustering: cannot save the checksum cache %s: %s", path, exc)
            with contextlib.suppress(OSError):
                os.remove(temporary)


_caches: dict[str, ChecksumCache] = {}
_caches_lock = threading.Lock()


def cache_for(root: str) -> ChecksumCache:
    """This process's cache of `root` (a node's roles, leader then follower, share it)."""
    with _caches_lock:
        cache = _caches.get(root)
        if cache is None:
            cache = _caches[root] = ChecksumCache(root)
        return cache


def _load(path: str) -> dict[str, tuple[Stamp, bytes]]:
    """The cache file's entries; a missing file is an empty cache, a malformed line is
    skipped (its file is hashed again)."""
    entries: dict[str, tuple[Stamp, bytes]] = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as lines:
            for line in lines:
                parsed = _parse(line.rstrip("\n"))
                if parsed is not None:
                    entries[parsed[0]] = parsed[1]
    except FileNotFoundError:
        pass
    except OSError as exc:
        logger.warning("clustering: cannot read the checksum cache %s: %s", path, exc)
    return entries


def _parse(line: str) -> tuple[str, tuple[Stamp, bytes]] | None:
    fields = line.split(" ", 5)
    if len(fields) != 6 or len(fields[0]) != SHA1_HEX_LEN or not fields[5]:
        return None
    try:
        sha1 = bytes.fromhex(fields[0])
        size, mtime_ns, ctime_ns, inode = (int(field) for field in fields[1:5])
    except ValueError:
        return None
    return fields[5], (Stamp(size, mtime_ns, ctime_ns, inode), sha1)
