"""The file tap: every change made to files under a data directory, as one byte stream.

Owns the *action* stream of cluster replication (docs/clustering.md): the leader's broker
records each write at a position, truncate, rename, remove and mkdir under its data
directory on a `FileTap` (through the wrappers of `files`), in the order they happened;
followers apply the stream to their own copy with an `ActionApplier`. It knows nothing of
segments, journals or sockets, and imports no asyncio: the replication server reads the
stream (`read`) and the follower feeds what it received (`feed`).

Order. An action is recorded right after its system call, on the thread that made it and
before that thread releases anything it holds. Two changes the broker orders (one
happens before the other: a lock, a round, a queue) are therefore recorded in that order;
changes it does not order touch different files, whose relative order does not matter.

Action encoding, little-endian (a byte stream: a read may end inside an action):
    u8 kind | u16 path length | path (utf-8, relative to the root, '/' separators) | body
    1 WRITE        u64 position | u32 length | data   pwrite; creates the file and parents
    2 TRUNCATE     u64 size                           creates the file if missing
    3 RENAME       u16 length | destination path      os.replace; creates parents of dst
    4 REMOVE       (no body)                          a file; missing is fine
    5 REMOVE_TREE  (no body)                          a directory and all under it
    6 MKDIR        (no body)                          makedirs(exist_ok=True)
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import shutil
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Final

# Files that belong to one node, matched on a path's first component: never recorded,
# never replicated, and refused by the applier.
LOCAL_FILES: Final = frozenset(
    {".lock", ".clustering_id", ".clustering_syncing", "checksums.sha1", "checksums.sha1.tmp"}
)

WRITE: Final = 1
TRUNCATE: Final = 2
RENAME: Final = 3
REMOVE: Final = 4
REMOVE_TREE: Final = 5
MKDIR: Final = 6
KINDS: Final = frozenset({WRITE, TRUNCATE, RENAME, REMOVE, REMOVE_TREE, MKDIR})

ACTION_DATA_BYTES_MAX: Final = 64 << 20  # one WRITE's data; longer writes are split
# The largest file position or size an action may name: far above any file of ours, and
# a bound on the sparse file a bad action could make.
FILE_BYTES_MAX: Final = 1 << 40
PATH_BYTES_MAX: Final = 4096
RETAIN_BYTES_MAX: Final = 256 << 20
# Descriptors an applier keeps open between actions (the files being appended to).
APPLIER_FDS_MAX: Final = 64

_HEAD: Final = struct.Struct("<BH")
_WRITE_BODY: Final = struct.Struct("<QI")
_U64: Final = struct.Struct("<Q")
_U16: Final = struct.Struct("<H")


class TapTrimmed(Exception):
    """A read asked for stream bytes the tap no longer holds."""

    def __init__(self, start: int, first_retained: int) -> None:
        super().__init__(f"tap position {start} is below the first retained {first_retained}")
        self.start = start
        self.first_retained = first_retained


class ActionError(Exception):
    """A malformed action: unknown kind, a path that escapes the root or names a node's
    own file, or a length over its limit."""


class FileTap:
    """Records, in order, every change made to files under `root` (thread-safe: the event
    loop, the fsync thread and to_thread workers all record)."""

    def __init__(self, root: str, *, retain_bytes_max: int = RETAIN_BYTES_MAX) -> None:
        assert retain_bytes_max > 0
        self.root = os.path.abspath(root)
        self._prefix = self.root.rstrip("/") + "/"
        self.retain_bytes_max = retain_bytes_max
        self._lock = threading.Lock()
        # The retained stream: `_buffer[0]` is stream position `_base`. Deleting from the
        # front of a bytearray only moves its start, so trimming costs no copy.
        self._buffer = bytearray()
        self._base = 0
        self.listener: Callable[[], None] | None = None

    # Read under the lock: a trim on another thread moves `_base` and the buffer's start
    # in two steps, and a position read between them would be too low (a round released
    # before the replicas have all of it).

    @property
    def position(self) -> int:
        with self._lock:
            return self._base + len(self._buffer)

    @property
    def first_retained(self) -> int:
        with self._lock:
            return self._base

    @property
    def retained_bytes(self) -> int:
        with self._lock:
            return len(self._buffer)

    def relative(self, path: str) -> str | None:
        """`path` relative to the root with '/' separators, or None when it is outside
        the root or one of LOCAL_FILES (not recorded)."""
        if not path.startswith(self._prefix):
            path = os.path.abspath(path)
            if not path.startswith(self._prefix):
                return None
        relative = path[len(self._prefix) :]
        if not relative or is_local(relative):
            return None
        return relative

    # Recording. Each builds its action, then appends it under the lock in one piece.

    def write(self, path: str, position: int, data: bytes | bytearray | memoryview) -> None:
        """Record `data` written at `position` of `path` (copied)."""
        relative = self.relative(path)
        if relative is None or not len(data):
            return
        name = relative.encode()
        view = memoryview(data).cast("B")
        for at in range(0, len(view), ACTION_DATA_BYTES_MAX):
            chunk = view[at : at + ACTION_DATA_BYTES_MAX]
            head = _HEAD.pack(WRITE, len(name)) + name
            self._append(head + _WRITE_BODY.pack(position + at, len(chunk)), chunk)

    def truncate(self, path: str, size: int) -> None:
        self._record(TRUNCATE, path, _U64.pack(size))

    def rename(self, src: str, dst: str) -> None:
        """Record os.replace(src, dst). A rename into or out of the root or LOCAL_FILES
        is recorded as what it does inside the root: a remove, or nothing."""
        source, destination = self.relative(src), self.relative(dst)
        if destination is None:
            if source is not None:
                self._record(REMOVE, src, b"")
            return
        if source is None:
            return  # the destination's new contents come from outside: not replicated
        target = destination.encode()
        self._record(RENAME, src, _U16.pack(len(target)) + target)

    def remove(self, path: str) -> None:
        self._record(REMOVE, path, b"")

    def remove_tree(self, path: str) -> None:
        self._record(REMOVE_TREE, path, b"")

    def mkdir(self, path: str) -> None:
        self._record(MKDIR, path, b"")

    def _record(self, kind: int, path: str, body: bytes) -> None:
        relative = self.relative(path)
        if relative is None:
            return
        name = relative.encode()
        self._append(_HEAD.pack(kind, len(name)) + name + body, b"")

    def _append(self, action: bytes, data: bytes | memoryview) -> None:
        with self._lock:
            buffer = self._buffer
            buffer += action
            buffer += data
            excess = len(buffer) - self.retain_bytes_max
            if excess > 0:
                del buffer[:excess]
                self._base += excess
        listener = self.listener
        if listener is not None:
            listener()

    # Consuming.

    def read(self, start: int, max_bytes: int) -> bytes:
        """Up to `max_bytes` of the stream from position `start` (b"" at the current
        position). Raises TapTrimmed when `start` is below `first_retained`, ValueError
        when it is past the current position."""
        with self._lock:
            at = start - self._base
            if at < 0:
                raise TapTrimmed(start, self._base)
            end = self._base + len(self._buffer)
            if start > end:
                raise ValueError(f"tap position {start} is past the end {end}")
            with memoryview(self._buffer) as view:
                return bytes(view[at : at + max_bytes])

    def trim(self, position: int) -> None:
        """Forget the bytes below `position` (what every follower has acked)."""
        with self._lock:
            drop = min(position - self._base, len(self._buffer))
            if drop > 0:
                del self._buffer[:drop]
                self._base += drop


class _Current:
    """The process-wide tap: `files` reads `current.tap` on every write (one attribute
    read when there is none)."""

    __slots__ = ("tap",)

    def __init__(self) -> None:
        self.tap: FileTap | None = None


current: Final = _Current()


def set_tap(tap: FileTap | None) -> None:
    """Set the process-wide tap (a cluster leader's), or clear it with None."""
    current.tap = tap


def get_tap() -> FileTap | None:
    return current.tap


def is_plain_relative(path: str) -> bool:
    """`path` names something inside a directory: relative, no empty, `.` or `..` part,
    no NUL (what the replication stream and a full sync may name)."""
    return not (
        not path
        or "\0" in path
        or path.startswith("/")
        or any(part in ("", ".", "..") for part in path.split("/"))
    )


def is_local(path: str) -> bool:
    """`path` (relative) is, or is under, one of a node's own files (LOCAL_FILES)."""
    return path.split("/", 1)[0] in LOCAL_FILES


def check_path(raw: bytes | memoryview) -> str:
    """The relative path an action names, or ActionError."""
    try:
        path = bytes(raw).decode()
    except UnicodeDecodeError:
        raise ActionError("action path is not utf-8") from None
    if not is_plain_relative(path):
        raise ActionError(f"action path {path!r} is not a plain relative path")
    if is_local(path):
        raise ActionError(f"action path {path!r} names a node's own file")
    return path


def _parse(view: memoryview, at: int) -> tuple[int, str, int, int] | None:
    """The action at `view[at:]`: (kind, path, body start, end),
    or None when it is incomplete. Raises ActionError as soon as the bytes present are
    enough to show it is malformed (so that an incomplete tail is bounded)."""
    have = len(view) - at
    if have < 1:
        return None
    kind = view[at]
    if kind not in KINDS:
        raise ActionError(f"unknown action kind {kind}")
    if have < _HEAD.size:
        return None
    _, name_bytes = _HEAD.unpack_from(view, at)
    if name_bytes > PATH_BYTES_MAX:
        raise ActionError(f"action path of {name_bytes} bytes is over {PATH_BYTES_MAX}")
    body = at + _HEAD.size + name_bytes
    if kind == WRITE:
        end = _write_end(view, body)
    elif kind == TRUNCATE:
        end = body + _U64.size
        if end <= len(view) and _U64.unpack_from(view, body)[0] > FILE_BYTES_MAX:
            raise ActionError("truncate size over the file size limit")
    elif kind == RENAME:
        end = body + _U16.size
        if end <= len(view):
            (target_bytes,) = _U16.unpack_from(view, body)
            if target_bytes > PATH_BYTES_MAX:
                raise ActionError(f"rename target of {target_bytes} bytes is over the limit")
            end += target_bytes
    else:
        end = body
    if end < 0 or end > len(view):
        return None
    return kind, check_path(view[at + _HEAD.size : body]), body, end


def _write_end(view: memoryview, body: int) -> int:
    """Where a WRITE whose body starts at `body` ends (-1 while its header is cut)."""
    if body + _WRITE_BODY.size > len(view):
        return -1
    position, length = _WRITE_BODY.unpack_from(view, body)
    assert isinstance(length, int)
    if length > ACTION_DATA_BYTES_MAX:
        raise ActionError(f"write of {length} bytes is over {ACTION_DATA_BYTES_MAX}")
    if position + length > FILE_BYTES_MAX:
        raise ActionError("write past the file size limit")
    return body + _WRITE_BODY.size + length


SYNC_THREADS: Final = 4  # the files one `ActionApplier.sync` fdatasyncs at once, at most


class ActionApplier:
    """The follower side: applies the action stream to a directory. Not thread-safe: one
    thread at a time.

    Replaying actions over a copy that already has their effect is harmless (writes,
    truncates, removes and mkdirs are idempotent; a rename whose source is gone does
    nothing), so a full sync may copy files while the stream it follows runs ahead.
    Applied actions are durable after `sync()`.
    """

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        os.makedirs(self.root, exist_ok=True)
        self._pending = bytearray()  # an incomplete action, bounded by the action limits
        self._applied = 0
        self._fds: OrderedDict[str, int] = OrderedDict()  # relative path -> fd, LRU
        self._dirty_files: set[str] = set()  # written or truncated since the last sync
        self._dirty_dirs: set[str] = set()  # entries created, renamed or removed
        # fdatasyncs of several files at once: the file system commits them together
        # (measured here: 3 files in 0.77 ms at once, 1.0 ms one after the other).
        self._syncs: concurrent.futures.ThreadPoolExecutor | None = None

    @property
    def applied(self) -> int:
        return self._applied

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Apply every complete action of what was received so far; keep an incomplete
        tail for the next call. Raises ActionError (nothing more is applied: the stream
        is broken) and OSError."""
        pending = self._pending
        if pending:
            pending += data
            source: bytes | bytearray | memoryview = pending
        else:
            source = data
        done = 0
        with memoryview(source).cast("B") as view:
            while (action := _parse(view, done)) is not None:
                kind, path, body, end = action
                self._apply(kind, path, view[body:end])
                self._applied += end - done
                done = end
            tail = bytes(view[done:]) if source is not pending else b""
        if source is pending:
            del pending[:done]
        else:
            self._pending = bytearray(tail)

    def _apply(self, kind: int, path: str, body: memoryview) -> None:
        if kind == WRITE:
            position: int = _WRITE_BODY.unpack_from(body)[0]
            fd = self._fd(path)
            data = body[_WRITE_BODY.size :]
            while data:
                written = os.pwrite(fd, data, position)
                data = data[written:]
                position += written
            self._dirty_files.add(path)
        elif kind == TRUNCATE:
            os.ftruncate(self._fd(path), _U64.unpack_from(body)[0])
            self._dirty_files.add(path)
        elif kind == RENAME:
            self._rename(path, check_path(body[_U16.size :]))
        elif kind == REMOVE:
            self._forget(path)
            with contextlib.suppress(FileNotFoundError):
                os.remove(self._full(path))
            self._dirty_dirs.add(_parent(path))
        elif kind == REMOVE_TREE:
            self._forget_tree(path)
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(self._full(path))
            self._dirty_dirs.add(_parent(path))
        else:
            self._make_dirs(path)

    def _full(self, path: str) -> str:
        return os.path.join(self.root, path)

    def _fd(self, path: str) -> int:
        """A writable descriptor of `path`, created (with its parents) if missing."""
        fds = self._fds
        fd = fds.get(path)
        if fd is not None:
            fds.move_to_end(path)
            return fd
        full = self._full(path)
        try:
            fd = os.open(full, os.O_WRONLY)
        except FileNotFoundError:
            self._make_dirs(_parent(path))
            fd = os.open(full, os.O_WRONLY | os.O_CREAT, 0o644)
            self._dirty_dirs.add(_parent(path))
        fds[path] = fd
        if len(fds) > APPLIER_FDS_MAX:
            self._close(next(iter(fds)))
        return fd

    def _close(self, path: str) -> None:
        """Close the cached descriptor of `path`, syncing it first if it is dirty (its
        writes must still be durable at the next `sync`)."""
        fd = self._fds.pop(path)
        try:
            if path in self._dirty_files:
                self._dirty_files.discard(path)
                os.fdatasync(fd)
        finally:
            os.close(fd)

    def _forget(self, path: str) -> None:
        """`path` is going away: its writes need no sync."""
        self._dirty_files.discard(path)
        fd = self._fds.pop(path, None)
        if fd is not None:
            os.close(fd)

    def _forget_tree(self, path: str) -> None:
        prefix = path + "/"
        for name in [p for p in self._fds if p.startswith(prefix)]:
            self._forget(name)
        self._dirty_files = {p for p in self._dirty_files if not p.startswith(prefix)}
        self._dirty_dirs = {p for p in self._dirty_dirs if p != path and not p.startswith(prefix)}

    def _rename(self, src: str, dst: str) -> None:
        self._forget(dst)
        self._forget_tree(dst)  # os.replace over an empty directory
        self._make_dirs(_parent(dst))
        try:
            os.replace(self._full(src), self._full(dst))
        except FileNotFoundError:
            return  # replayed over a copy made after the rename (see the class docstring)
        # Cached descriptors follow their files to the new names (a renamed directory
        # takes every file under it along), and so does their dirt.
        prefix = src + "/"

        def moved(path: str) -> str:
            if path == src:
                return dst
            return dst + path[len(src) :] if path.startswith(prefix) else path

        self._fds = OrderedDict((moved(p), fd) for p, fd in self._fds.items())
        self._dirty_files = {moved(p) for p in self._dirty_files}
        self._dirty_dirs = {moved(p) for p in self._dirty_dirs}
        self._dirty_dirs.add(_parent(src))
        self._dirty_dirs.add(_parent(dst))

    def _make_dirs(self, path: str) -> None:
        """makedirs of `path` (relative; "" is the root), marking the parent of every
        directory it creates for a sync."""
        if not path or os.path.isdir(self._full(path)):
            return
        self._make_dirs(_parent(path))
        with contextlib.suppress(FileExistsError):
            os.mkdir(self._full(path))
        self._dirty_dirs.add(_parent(path))

    def sync(self) -> None:
        """fdatasync every file written or truncated since the last sync and fsync every
        directory whose entries changed: afterwards everything applied so far is durable.
        Raises OSError."""
        fds = [self._fds[path] for path in self._dirty_files]  # dirty ones stay cached
        if len(fds) == 1:
            os.fdatasync(fds[0])
        elif fds:
            if self._syncs is None:
                self._syncs = concurrent.futures.ThreadPoolExecutor(
                    SYNC_THREADS, thread_name_prefix="streamq-apply-sync"
                )
            for _ in self._syncs.map(os.fdatasync, fds):
                pass  # raises the first OSError
        self._dirty_files.clear()
        # Deepest first: a new directory's own entries before its entry in its parent.
        for path in sorted(self._dirty_dirs, key=lambda p: -p.count("/") if p else 1):
            try:
                fd = os.open(self._full(path) if path else self.root, os.O_RDONLY | os.O_DIRECTORY)
            except FileNotFoundError:
                continue  # removed since
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self._dirty_dirs.clear()

    def close(self) -> None:
        """Close the cached descriptors (without syncing them)."""
        if self._syncs is not None:
            self._syncs.shutdown(wait=True)
            self._syncs = None
        while self._fds:
            os.close(self._fds.popitem()[1])
        self._dirty_files.clear()


def _parent(path: str) -> str:
    return path.rpartition("/")[0]
