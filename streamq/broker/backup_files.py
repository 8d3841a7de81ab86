"""A backup's file work: the target's checks, the copy of a data directory, the replay.

Owns the blocking half of `streamq ctl backup` (callers run it in a worker thread; the
broker's half, which records the changes made meanwhile and chooses the sync point, is
`streamq.broker.backup`):

- `check_target`: DIR must be absolute, empty or missing, and outside the data directory;
- `copy_tree`: every file and directory under the data directory but a node's own files
  (`LOCAL_FILES`: the lock, a cluster node's id and caches), copied, or hard-linked when
  the file can no longer change: a sealed segment (its `.idx` is there: the index is
  renamed into place only after the segment's last write, docs/log-format.md) and an
  index. A hard link shares the file with the live directory, so nothing here ever
  writes through one: `SnapshotApplier` replaces a link by a copy before any write to it;
- `SnapshotApplier`: the cluster follower's `ActionApplier` over the copy, replaying the
  changes made while the copy was taken (a copy taken while files change is made exact
  by replaying every change since before it began, docs/clustering.md's full sync);
- `finish`: fsync every directory and write the manifest, `streamq-backup.json`, last: a
  directory without it is an unfinished backup.

Durability: copied files are fsynced as they are written; the replay by `sync()`; the
directories and the manifest by `finish`. Nothing here writes under the data directory.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Final

from streamq import __version__
from streamq.log.format import INDEX_SUFFIX
from streamq.log.tap import LOCAL_FILES, REMOVE, REMOVE_TREE, RENAME, TRUNCATE, WRITE, ActionApplier

JsonScalar = str | int | bool
MANIFEST: Final = "streamq-backup.json"
MANIFEST_FORMAT: Final = "streamq-backup"
MANIFEST_VERSION: Final = 1
SEGMENT_SUFFIX: Final = ".seg"
COPY_CHUNK_BYTES: Final = 4 << 20  # read and write at a time; the tap is drained between
# A directory whose files vanish while it is copied (renamed, removed) is copied again,
# at most this many times; past it the backup fails and may be tried again.
DIRECTORY_COPIES_MAX: Final = 5


class BackupRefused(Exception):
    """The target cannot take a backup (not empty, inside the data directory...)."""


class BackupFailed(Exception):
    """The backup could not be completed; the target was emptied again."""


@dataclass(slots=True)
class CopyCounts:
    files_copied: int = 0
    bytes_copied: int = 0
    files_linked: int = 0
    bytes_linked: int = 0
    directories: int = 0
    links_broken: int = 0  # linked files a replayed change wrote to (copied first)


def check_target(data_dir: str, target: str) -> bool:
    """Refuse a target that cannot take a backup of `data_dir`; True when it must be
    created (it does not exist yet). Raises BackupRefused."""
    if not os.path.isabs(target):
        raise BackupRefused(f"the backup directory must be an absolute path: {target!r}")
    source = os.path.realpath(data_dir)
    real = os.path.realpath(target)
    if real == source or real.startswith(source.rstrip("/") + "/"):
        raise BackupRefused(
            f"the backup directory {target} is inside the data directory {data_dir}; "
            "choose one outside it"
        )
    if not os.path.lexists(target):
        return True
    if not os.path.isdir(target):
        raise BackupRefused(f"{target} exists and is not a directory")
    if os.listdir(target):
        raise BackupRefused(f"the backup directory {target} is not empty")
    return False


def create_target(target: str) -> None:
    """Create the target directory and its missing parents (durable: parent fsynced)."""
    os.makedirs(target)
    _fsync_directory(os.path.dirname(target.rstrip("/")) or "/")


def empty_target(target: str, *, created: bool) -> None:
    """Undo a failed backup: remove what it wrote (and the directory if it made it).
    Removing a hard link leaves the data directory's file as it was."""
    with contextlib.suppress(FileNotFoundError):
        if created:
            shutil.rmtree(target)
            return
        for name in os.listdir(target):
            full = os.path.join(target, name)
            if os.path.isdir(full) and not os.path.islink(full):
                shutil.rmtree(full)
            else:
                os.remove(full)


class TreeCopier:
    """Copies (or links) a data directory into an empty target, calling `between` after
    each chunk and each file (the broker drains its tap there)."""

    def __init__(self, source: str, target: str, *, links: bool, between: Callable[[], None]):
        self.source = os.path.abspath(source)
        self.target = os.path.abspath(target)
        self.links = links
        self.between = between
        self.counts = CopyCounts()
        self.linked: set[str] = set()  # relative paths of the target's hard links

    def run(self) -> CopyCounts:
        """Copy the whole tree. Raises BackupFailed, OSError."""
        pending = [""]
        while pending:
            relative = pending.pop()
            pending.extend(reversed(self._copy_directory(relative)))
        return self.counts

    def _copy_directory(self, relative: str) -> list[str]:
        """Copy the files of one directory; returns its subdirectories (relative)."""
        for _ in range(DIRECTORY_COPIES_MAX):
            try:
                names = sorted(os.listdir(os.path.join(self.source, relative)))
            except FileNotFoundError:
                return []  # removed or renamed away: the replay does the same to the copy
            if not relative:
                # A data directory restored from a backup holds that backup's manifest: it
                # is left out, so that only `finish` writes one (a backup cut short has none).
                names = [name for name in names if name not in LOCAL_FILES and name != MANIFEST]
            os.makedirs(os.path.join(self.target, relative), exist_ok=True)
            subdirectories, complete = self._copy_entries(relative, names)
            if complete:
                self.counts.directories += 1
                return subdirectories
        raise BackupFailed(
            f"{os.path.join(self.source, relative)} kept changing while it was copied "
            f"({DIRECTORY_COPIES_MAX} tries); try the backup again"
        )

    def _copy_entries(self, relative: str, names: list[str]) -> tuple[list[str], bool]:
        """(subdirectories, whether every listed file was still there). A file that
        vanished was renamed or removed: a rename may have put another file's contents
        under a name copied before, so the caller copies the directory again."""
        subdirectories: list[str] = []
        present = set(names)
        complete = True
        for name in names:
            path = f"{relative}/{name}" if relative else name
            full = os.path.join(self.source, path)
            try:
                mode = os.lstat(full).st_mode
                if stat.S_ISDIR(mode):
                    subdirectories.append(path)
                elif stat.S_ISREG(mode):  # the broker makes no links, devices or fifos
                    self._copy_file(path, full, _immutable(name, present))
            except FileNotFoundError:
                complete = False
            self.between()
        return subdirectories, complete

    def _copy_file(self, path: str, full: str, immutable: bool) -> None:
        destination = os.path.join(self.target, path)
        if self.links and immutable:
            with contextlib.suppress(FileNotFoundError):
                os.remove(destination)  # a directory copied again
            try:
                os.link(full, destination)
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                    raise
                self.links = False  # another file system: copy from now on
            else:
                self.linked.add(path)
                self.counts.files_linked += 1
                self.counts.bytes_linked += os.stat(destination).st_size
                return
        self.linked.discard(path)
        self.counts.bytes_copied += copy_file(full, destination, self.between)
        self.counts.files_copied += 1


def _immutable(name: str, names: set[str]) -> bool:
    """A sealed segment (its index exists) or an index: never written again."""
    if name.endswith(INDEX_SUFFIX):
        return True
    stem = name.removesuffix(SEGMENT_SUFFIX)
    return name.endswith(SEGMENT_SUFFIX) and stem + INDEX_SUFFIX in names


def copy_file(source: str, destination: str, between: Callable[[], None] = lambda: None) -> int:
    """Copy `source` as it is now into a new `destination` (replaced if there), fsynced
    before returning; the bytes copied. Raises FileNotFoundError if `source` is gone."""
    read_fd = os.open(source, os.O_RDONLY)
    try:
        write_fd = os.open(destination, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            total = 0
            while chunk := os.read(read_fd, COPY_CHUNK_BYTES):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(write_fd, view) :]
                total += len(chunk)
                between()
            os.fsync(write_fd)
            return total
        finally:
            os.close(write_fd)
    finally:
        os.close(read_fd)


class SnapshotApplier(ActionApplier):
    """`ActionApplier` over a backup: a change to a hard-linked file first replaces the
    link by a copy, so that the replay never writes to the data directory's file."""

    def __init__(self, root: str, linked: set[str], counts: CopyCounts) -> None:
        super().__init__(root)
        self.linked = linked
        self.counts = counts

    # Overrides the applier's one dispatch point (tap.py), to see each action first.
    def _apply(self, kind: int, path: str, body: memoryview) -> None:
        if kind in (WRITE, TRUNCATE) and path in self.linked:
            self._break_link(path)
        elif kind == RENAME:
            target = bytes(body[2:]).decode()
            self._move_links(path, target)
        elif kind in (REMOVE, REMOVE_TREE):
            prefix = path + "/"
            self.linked = {p for p in self.linked if p != path and not p.startswith(prefix)}
        super()._apply(kind, path, body)

    def _break_link(self, path: str) -> None:
        full = os.path.join(self.root, path)
        tmp = full + ".backup-copy"
        copy_file(full, tmp)
        os.replace(tmp, full)
        self.linked.discard(path)
        self.counts.links_broken += 1

    def _move_links(self, source: str, target: str) -> None:
        """A rename in the copy: links under the source follow it; the target's go."""
        prefix, target_prefix = source + "/", target + "/"
        moved: set[str] = set()
        for path in self.linked:
            if path == target or path.startswith(target_prefix):
                continue
            if path == source:
                moved.add(target)
            elif path.startswith(prefix):
                moved.add(target + path[len(source) :])
            else:
                moved.add(path)
        self.linked = moved


def finish(target: str, manifest: dict[str, object]) -> None:
    """fsync every directory of the backup, then write the manifest (temp file, fsync,
    rename, fsync): once it is there, the backup is complete and durable."""
    for directory, _dirnames, _filenames in os.walk(target, topdown=False):
        _fsync_directory(directory)
    data = json.dumps(manifest, indent=2, sort_keys=True).encode() + b"\n"
    path = os.path.join(target, MANIFEST)
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
    _fsync_directory(target)


def manifest_counts(counts: CopyCounts) -> dict[str, object]:
    return dict(asdict(counts))


def copy_stopped(data_dir: str, target: str, *, links: bool) -> dict[str, JsonScalar]:
    """Back up the data directory of a stopped broker (the caller holds its lock): a plain
    copy, nothing changing meanwhile. Returns the manifest. Raises BackupRefused,
    BackupFailed, OSError; on failure the target is emptied again."""
    must_create = check_target(data_dir, target)
    started_ms = int(time.time() * 1000)
    if must_create:
        create_target(target)
    try:
        counts = TreeCopier(data_dir, target, links=links, between=lambda: None).run()
        finished_ms = int(time.time() * 1000)
        manifest: dict[str, JsonScalar] = {
            "format": MANIFEST_FORMAT,
            "version": MANIFEST_VERSION,
            "streamq_version": __version__,
            "directory": target,
            "data_dir": data_dir,
            "started_ms": started_ms,
            "sync_point_ms": started_ms,  # stopped: nothing changed during the copy
            "finished_ms": finished_ms,
            "replayed_bytes": 0,
            "online": False,
            **asdict(counts),
        }
        finish(target, dict(manifest))
    except BaseException:
        empty_target(target, created=must_create)
        raise
    return manifest


def _fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
