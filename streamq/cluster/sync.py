"""The full sync's file comparison: what a data directory holds, and what a follower lacks.

Owns listing a data directory (relative path, size, SHA-1 of every regular file, from the
node's checksum cache where a file has not changed: `streamq.cluster.checksums`, and every
directory), and the follower's plan: which of its files and
directories to remove, which to truncate (its copy has a tail the leader's lacks), which to
ask for. Blocking file I/O only: callers run it in a worker thread. It never touches a
node's own files (`LOCAL_FILES`) and refuses paths that leave the data directory.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Final

from streamq.cluster.checksums import cache_for, file_sha1
from streamq.cluster.replication import NO_SHA1, ReplicationError
from streamq.log.tap import LOCAL_FILES, is_local, is_plain_relative

# The marker a follower keeps in its data directory while its copy is not consistent.
SYNCING_MARKER: Final = ".clustering_syncing"


@dataclass(frozen=True, slots=True)
class Entry:
    path: str  # relative, '/' separators
    is_directory: bool
    size: int = 0
    sha1: bytes = NO_SHA1


@dataclass(slots=True)
class SyncPlan:
    remove_files: list[str] = field(default_factory=list)
    remove_directories: list[str] = field(default_factory=list)  # deepest first
    make_directories: list[str] = field(default_factory=list)
    truncate: list[tuple[str, int]] = field(default_factory=list)  # our copy has a tail
    request: list[Entry] = field(default_factory=list)  # our size and SHA-1 (0: none)

    def changes(self) -> bool:
        return bool(
            self.remove_files
            or self.remove_directories
            or self.make_directories
            or self.truncate
            or self.request
        )


def check_relative(path: str) -> str:
    """`path` if it is a plain relative path naming no node-local file, else
    ReplicationError (a leader or follower never names anything outside the directory)."""
    if not is_plain_relative(path) or is_local(path):
        raise ReplicationError(f"path {path!r} is not a plain relative path of the data")
    return path


def _walk(root: str) -> Iterator[tuple[str, str, list[str], list[str]]]:
    """os.walk of `root` without LOCAL_FILES, sorted: (relative prefix ending in '/' or
    "", directory, its subdirectories (prunable), its files)."""
    for directory, dirnames, filenames in os.walk(root):
        relative_dir = os.path.relpath(directory, root).replace(os.sep, "/")
        prefix = "" if relative_dir == "." else relative_dir + "/"
        local = LOCAL_FILES if not prefix else frozenset()
        dirnames[:] = sorted(name for name in dirnames if name not in local)
        yield prefix, directory, dirnames, sorted(n for n in filenames if n not in local)


def list_tree(root: str) -> list[Entry]:
    """Every directory and regular file under `root` but LOCAL_FILES, parents first, with
    sizes and SHA-1s (from the checksum cache where a file has not changed). A file
    removed while listing is left out."""
    cache = cache_for(root)
    entries: list[Entry] = []
    for prefix, directory, dirnames, filenames in _walk(root):
        for name in dirnames:
            entries.append(Entry(prefix + name, True))
        for name in filenames:
            full = os.path.join(directory, name)
            try:
                if not os.path.isfile(full) or os.path.islink(full):
                    continue
                size, sha1 = cache.sha1(prefix + name)
                entries.append(Entry(prefix + name, False, size, sha1))
            except FileNotFoundError:
                continue
    cache.keep_only({entry.path for entry in entries if not entry.is_directory})
    cache.save()
    return entries


def plan_sync(root: str, leader: list[Entry]) -> SyncPlan:
    """What the follower at `root` must do for its copy to become the leader's listing."""
    wanted = {entry.path: entry for entry in leader}
    ours = {entry.path: entry for entry in _list_shallow(root)}
    plan = SyncPlan()
    for path, entry in ours.items():
        theirs = wanted.get(path)
        if theirs is not None and theirs.is_directory == entry.is_directory:
            continue
        if entry.is_directory:
            plan.remove_directories.append(path)
        else:
            plan.remove_files.append(path)
    plan.remove_directories.sort(key=lambda path: -path.count("/"))
    for path, entry in wanted.items():
        check_relative(path)
        mine = ours.get(path)
        if entry.is_directory:
            if mine is None or not mine.is_directory:
                plan.make_directories.append(path)
            continue
        _plan_file(root, entry, mine if mine is not None and not mine.is_directory else None, plan)
    cache = cache_for(root)
    cache.keep_only({path for path, entry in ours.items() if not entry.is_directory})
    cache.save()
    return plan


def _plan_file(root: str, leader: Entry, mine: Entry | None, plan: SyncPlan) -> None:
    if mine is None:
        plan.request.append(Entry(leader.path, False))
        return
    full = os.path.join(root, leader.path)
    if mine.size > leader.size and file_sha1(full, leader.size) == leader.sha1:
        # Our copy is the leader's plus a tail it never confirmed (a former leader's).
        plan.truncate.append((leader.path, leader.size))
        return
    if mine.size != leader.size:
        plan.request.append(Entry(leader.path, False, mine.size, file_sha1(full)))
        return
    size, sha1 = cache_for(root).sha1(leader.path)  # equal sizes: most often the same file
    if size != leader.size or sha1 != leader.sha1:
        plan.request.append(Entry(leader.path, False, size, sha1))


def _list_shallow(root: str) -> list[Entry]:
    """Every directory and regular file under `root` but LOCAL_FILES, with sizes only."""
    entries: list[Entry] = []
    for prefix, directory, dirnames, filenames in _walk(root):
        entries.extend(Entry(prefix + name, True) for name in dirnames)
        for name in filenames:
            try:
                size = os.lstat(os.path.join(directory, name)).st_size
            except FileNotFoundError:
                continue
            entries.append(Entry(prefix + name, False, size))
    return entries


def apply_removals(root: str, plan: SyncPlan) -> None:
    """Remove, truncate and create what the plan says (durable after `fsync_tree`)."""
    for path in plan.remove_files:
        _ignore_missing(os.remove, os.path.join(root, path))
    for path in plan.remove_directories:
        _remove_tree(os.path.join(root, path))
    for path in plan.make_directories:
        os.makedirs(os.path.join(root, path), exist_ok=True)
    for path, size in plan.truncate:
        os.truncate(os.path.join(root, path), size)


def fsync_tree(root: str) -> None:
    """fsync every directory under `root` (creations, removals and renames in them become
    durable); files are fsynced by whoever wrote them."""
    for directory, _dirnames, _filenames in os.walk(root):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _remove_tree(path: str) -> None:
    for directory, dirnames, filenames in os.walk(path, topdown=False):
        for name in filenames:
            _ignore_missing(os.remove, os.path.join(directory, name))
        for name in dirnames:
            full = os.path.join(directory, name)
            if os.path.islink(full):
                _ignore_missing(os.remove, full)
            else:
                _ignore_missing(os.rmdir, full)
    _ignore_missing(os.rmdir, path)


def _ignore_missing(fn: Callable[[str], None], path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        fn(path)
