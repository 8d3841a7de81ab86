"""The file tap and the action applier: what the tap records is what the applier does.

Method: make changes under a directory through `files` with a tap set, apply the tap's
stream to a second directory (all at once, and one byte at a time), and compare the trees;
then feed malformed actions and check each is refused with ActionError.
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamq.log import files
from streamq.log.tap import (
    ACTION_DATA_BYTES_MAX,
    MKDIR,
    REMOVE,
    RENAME,
    TRUNCATE,
    WRITE,
    ActionApplier,
    ActionError,
    FileTap,
    TapTrimmed,
    set_tap,
)


def tree(root: Path) -> dict[str, bytes | None]:
    """Every file (bytes) and directory (None) under `root`, by relative path."""
    found: dict[str, bytes | None] = {}
    for directory, dirs, names in os.walk(root):
        for name in dirs:
            found[os.path.relpath(os.path.join(directory, name), root)] = None
        for name in names:
            found[os.path.relpath(os.path.join(directory, name), root)] = Path(
                directory, name
            ).read_bytes()
    return found


@pytest.fixture
def tapped(tmp_path: Path) -> Iterator[tuple[Path, FileTap]]:
    source = tmp_path / "source"
    source.mkdir()
    tap = FileTap(str(source))
    set_tap(tap)
    try:
        yield source, tap
    finally:
        set_tap(None)


def changes(root: Path) -> None:
    """One of every kind of change, through the wrappers."""
    files.makedirs(str(root / "a" / "b"))
    fd = files.open_fd(str(root / "a" / "b" / "log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    files.append_all(fd, b"hello ")
    files.write_all(fd, b"world")
    files.close_fd(fd)
    fd = files.open_fd(str(root / "pos"), os.O_RDWR | os.O_CREAT)
    files.pwrite(fd, b"xyz", 10)  # a hole before it
    files.ftruncate(fd, 12)
    files.pwrite(fd, b"A", 0)
    files.close_fd(fd)
    files.write_file_atomic(str(root / "atomic"), b"first", fsync_dir=True)
    files.write_file_atomic(str(root / "atomic"), b"second", fsync_dir=False)
    # A descriptor follows its file through a rename, as a journal compaction needs.
    fd = files.open_fd(str(root / "j.tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND)
    files.write_all(fd, b"snapshot|")
    files.replace(str(root / "j.tmp"), str(root / "j"))
    files.write_all(fd, b"later")
    files.close_fd(fd)
    files.makedirs(str(root / "gone" / "deep"))
    files.write_file_atomic(str(root / "gone" / "deep" / "f"), b"x", fsync_dir=False)
    files.remove_tree(str(root / "gone"))
    files.remove_tree(str(root / "never-was"))
    files.write_file_atomic(str(root / "rm"), b"x", fsync_dir=False)
    files.remove(str(root / "rm"))
    # Node-local files and files outside the root are not recorded.
    files.write_file_atomic(str(root / ".clustering_id"), b"node", fsync_dir=False)
    files.write_file_atomic(str(root.parent / "outside"), b"o", fsync_dir=False)
    files.makedirs(str(root / "empty"))


def expected(root: Path) -> dict[str, bytes | None]:
    found = tree(root)
    del found[".clustering_id"]
    return found


def test_applied_stream_reproduces_the_tree(tapped: tuple[Path, FileTap], tmp_path: Path) -> None:
    source, tap = tapped
    changes(source)
    stream = tap.read(0, tap.position + 1)
    assert len(stream) == tap.position
    whole = tmp_path / "whole"
    applier = ActionApplier(str(whole))
    applier.feed(stream)
    applier.sync()
    applier.close()
    assert applier.applied == len(stream)
    assert tree(whole) == expected(source)
    assert tree(whole)["pos"] == b"A" + bytes(9) + b"xy"
    assert tree(whole)["j"] == b"snapshot|later"

    bytewise = tmp_path / "bytewise"
    applier = ActionApplier(str(bytewise))
    for i in range(len(stream)):
        applier.feed(stream[i : i + 1])
    applier.sync()
    applier.close()
    assert applier.applied == len(stream)
    assert tree(bytewise) == expected(source)


def test_replaying_the_stream_again_is_harmless(
    tapped: tuple[Path, FileTap], tmp_path: Path
) -> None:
    source, tap = tapped
    changes(source)
    stream = tap.read(0, tap.position)
    copy = tmp_path / "copy"
    for _ in range(2):
        applier = ActionApplier(str(copy))
        applier.feed(stream)
        applier.sync()
        applier.close()
    assert tree(copy) == expected(source)


def test_an_applier_past_its_descriptor_limit_keeps_every_write(tmp_path: Path) -> None:
    tap = FileTap(str(tmp_path / "src"))
    for i in range(200):
        tap.write(str(tmp_path / "src" / f"f{i}"), 0, b"%d" % i)
    for i in range(200):
        tap.write(str(tmp_path / "src" / f"f{i}"), 5, b"!")
    applier = ActionApplier(str(tmp_path / "dst"))
    applier.feed(tap.read(0, tap.position))
    applier.sync()
    applier.close()
    for i in range(200):
        data = (tmp_path / "dst" / f"f{i}").read_bytes()
        assert data == (b"%d" % i).ljust(5, b"\0") + b"!"


def test_large_writes_are_split_into_actions_under_the_limit(tmp_path: Path) -> None:
    tap = FileTap(str(tmp_path / "src"), retain_bytes_max=1 << 30)
    data = os.urandom(1024) * (ACTION_DATA_BYTES_MAX // 1024 + 3)
    tap.write(str(tmp_path / "src" / "big"), 7, data)
    applier = ActionApplier(str(tmp_path / "dst"))
    stream = tap.read(0, tap.position)
    for at in range(0, len(stream), 1 << 20):
        applier.feed(stream[at : at + (1 << 20)])
    applier.close()
    assert (tmp_path / "dst" / "big").read_bytes() == bytes(7) + data


def test_retention_trim_and_reads(tmp_path: Path) -> None:
    tap = FileTap(str(tmp_path), retain_bytes_max=1000)
    calls: list[int] = []
    tap.listener = lambda: calls.append(tap.position)
    tap.write(str(tmp_path / "f"), 0, b"x" * 100)
    first = tap.position
    assert calls == [first]
    assert tap.read(first, 10) == b""
    with pytest.raises(ValueError, match="past the end"):
        tap.read(first + 1, 10)
    tap.trim(50)
    assert tap.first_retained == 50
    assert tap.retained_bytes == first - 50
    with pytest.raises(TapTrimmed, match="below the first retained 50"):
        tap.read(49, 10)
    for _ in range(20):
        tap.write(str(tmp_path / "f"), 0, b"y" * 100)
    assert tap.retained_bytes == 1000
    assert tap.first_retained == tap.position - 1000
    tap.trim(tap.position + 5)  # past the end: everything goes, nothing breaks
    assert tap.retained_bytes == 0


def head(kind: int, path: bytes) -> bytes:
    return struct.pack("<BH", kind, len(path)) + path


MALFORMED = {
    "unknown kind": head(9, b"f"),
    "absolute path": head(REMOVE, b"/etc/passwd"),
    "dot-dot": head(REMOVE, b"a/../../x"),
    "empty path": head(MKDIR, b""),
    "empty component": head(MKDIR, b"a//b"),
    "node-local file": head(TRUNCATE, b".lock") + struct.pack("<Q", 0),
    "not utf-8": head(REMOVE, b"\xff\xfe"),
    "nul byte": head(REMOVE, b"a\0b"),
    "write too long": head(WRITE, b"f") + struct.pack("<QI", 0, ACTION_DATA_BYTES_MAX + 1),
    "write too far": head(WRITE, b"f") + struct.pack("<QI", 1 << 50, 1) + b"x",
    "truncate too far": head(TRUNCATE, b"f") + struct.pack("<Q", 1 << 50),
    "path too long": head(REMOVE, b"a" * 5000),
    "rename escaping": head(RENAME, b"f") + struct.pack("<H", 6) + b"../etc",
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_actions_are_refused(name: str, tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"keep")
    applier = ActionApplier(str(tmp_path / "dst"))
    with pytest.raises(ActionError):
        applier.feed(MALFORMED[name])
    assert applier.applied == 0
    assert not (tmp_path / "dst").exists() or not any((tmp_path / "dst").iterdir())
    applier.close()


def test_a_malformed_header_is_refused_before_its_body_arrives(tmp_path: Path) -> None:
    applier = ActionApplier(str(tmp_path))
    action = head(WRITE, b"f") + struct.pack("<QI", 0, ACTION_DATA_BYTES_MAX + 1)
    with pytest.raises(ActionError, match="over"):
        for i in range(len(action)):
            applier.feed(action[i : i + 1])
    applier.close()


def test_threads_recording_at_once_keep_each_ones_order(tmp_path: Path) -> None:
    """Four threads append to their own files at once: every action arrives whole, and
    each file ends as its thread wrote it."""
    source = tmp_path / "src"
    tap = FileTap(str(source))
    writes = 2000

    def record(name: str) -> None:
        for i in range(writes):
            tap.write(str(source / name), i * 4, b"%04d" % i)

    threads = [threading.Thread(target=record, args=(f"t{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    applier = ActionApplier(str(tmp_path / "dst"))
    applier.feed(tap.read(0, tap.position))
    applier.close()
    expected = b"".join(b"%04d" % i for i in range(writes))
    for n in range(4):
        assert (tmp_path / "dst" / f"t{n}").read_bytes() == expected


def test_a_renamed_directory_takes_its_cached_files_along(
    tapped: tuple[Path, FileTap], tmp_path: Path
) -> None:
    """As a vhost deleted and created again: its directory is renamed away and removed,
    then a file at an old path is written anew. The applier's cached descriptor of the
    old file must not receive the new writes."""
    source, tap = tapped
    files.makedirs(str(source / "v" / "log"))
    fd = files.open_fd(str(source / "v" / "log" / "seg"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    files.append_all(fd, b"old")
    files.close_fd(fd)
    copy = tmp_path / "copy"
    applier = ActionApplier(str(copy))
    applier.feed(tap.read(0, tap.position))  # the old file's descriptor is cached now
    start = tap.position
    files.replace(str(source / "v"), str(source / "v.deleted"))
    files.remove_tree(str(source / "v.deleted"))
    files.makedirs(str(source / "v" / "log"))
    fd = files.open_fd(str(source / "v" / "log" / "seg"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    files.append_all(fd, b"new")
    files.close_fd(fd)
    applier.feed(tap.read(start, tap.position))
    applier.sync()
    applier.close()
    assert tree(copy) == expected_without_local(source)
    assert (copy / "v" / "log" / "seg").read_bytes() == b"new"


def expected_without_local(root: Path) -> dict[str, bytes | None]:
    return {k: v for k, v in tree(root).items() if k != ".clustering_id"}
