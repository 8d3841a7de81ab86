"""The file work of a backup (streamq/broker/backup_files.py): which targets are refused,
what is hard-linked and what copied, a directory whose files are renamed while it is
copied, and the replay that must never write through a hard link to the live file.

Method: real directories under tmp_path; changes are made through `streamq.log.files`
with a real `FileTap` recording them, as the broker makes them, and replayed from the
tap's bytes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamq.broker.backup_files import (
    BackupRefused,
    SnapshotApplier,
    TreeCopier,
    check_target,
    copy_stopped,
)
from streamq.log import files
from streamq.log.tap import FileTap, set_tap

TAP_READ_MAX = 1 << 30


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A data directory with a sealed segment and its index, an active segment, a
    journal and a node's own files."""
    root = tmp_path / "data"
    log = root / "vhosts" / "v" / "messages"
    log.mkdir(parents=True)
    (log / "00000000000000000000.seg").write_bytes(b"sealed" * 100)
    (log / "00000000000000000000.idx").write_bytes(b"index")
    (log / "00000000000000000100.seg").write_bytes(b"active")
    (root / "vhosts" / "v" / "queues").mkdir()
    (root / "vhosts" / "v" / "queues" / "q.journal").write_bytes(b"journal")
    (root / ".lock").write_bytes(b"123\n")
    (root / ".clustering_id").write_bytes(b"abc")
    (root / "streamq-backup.json").write_bytes(b"{}")  # restored from an earlier backup
    return root


@pytest.fixture
def tap(data_dir: Path) -> Iterator[FileTap]:
    recording = FileTap(str(data_dir))
    set_tap(recording)
    try:
        yield recording
    finally:
        set_tap(None)


def test_targets_refused(data_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(BackupRefused, match="absolute"):
        check_target(str(data_dir), "relative/dir")
    with pytest.raises(BackupRefused, match="inside the data directory"):
        check_target(str(data_dir), str(data_dir / "vhosts" / "backup"))
    with pytest.raises(BackupRefused, match="inside the data directory"):
        check_target(str(data_dir), str(data_dir))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_bytes(b"")
    with pytest.raises(BackupRefused, match="not empty"):
        check_target(str(data_dir), str(tmp_path / "full"))
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(BackupRefused, match="not a directory"):
        check_target(str(data_dir), str(tmp_path / "file"))
    (tmp_path / "empty").mkdir()
    assert check_target(str(data_dir), str(tmp_path / "empty")) is False
    assert check_target(str(data_dir), str(tmp_path / "new" / "dir")) is True


def test_a_symlink_into_the_data_directory_is_refused(data_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "sneaky").symlink_to(data_dir / "vhosts")
    with pytest.raises(BackupRefused, match="inside the data directory"):
        check_target(str(data_dir), str(tmp_path / "sneaky"))


def test_sealed_segments_and_indexes_are_linked_the_rest_copied(
    data_dir: Path, tmp_path: Path
) -> None:
    target = tmp_path / "backup"
    target.mkdir()
    counts = TreeCopier(str(data_dir), str(target), links=True, between=lambda: None).run()
    log = target / "vhosts" / "v" / "messages"
    sealed = log / "00000000000000000000.seg"
    assert os.stat(sealed).st_ino == os.stat(data_dir / "vhosts/v/messages" / sealed.name).st_ino
    assert os.stat(log / "00000000000000000000.idx").st_nlink == 2
    active = log / "00000000000000000100.seg"
    assert active.read_bytes() == b"active" and os.stat(active).st_nlink == 1
    assert (target / "vhosts/v/queues/q.journal").read_bytes() == b"journal"
    assert not (target / ".lock").exists() and not (target / ".clustering_id").exists()
    assert not (target / "streamq-backup.json").exists()
    assert (counts.files_linked, counts.files_copied) == (2, 2)


def test_without_links_everything_is_copied(data_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "backup"
    target.mkdir()
    counts = TreeCopier(str(data_dir), str(target), links=False, between=lambda: None).run()
    assert (counts.files_linked, counts.files_copied) == (0, 4)
    assert os.stat(target / "vhosts/v/messages/00000000000000000000.seg").st_nlink == 1


def test_a_file_renamed_over_one_already_copied_is_copied_again(
    data_dir: Path, tmp_path: Path
) -> None:
    """A compaction renames `q.journal.tmp` over `q.journal` after the copier took the old
    journal and before it reaches the temp file: the directory is copied again, so the
    copy ends with the new journal (the rename's replay finds no source and does
    nothing)."""
    queues = data_dir / "vhosts" / "v" / "queues"
    (queues / "q.journal.tmp").write_bytes(b"compacted")
    renamed = []

    def between() -> None:
        if not renamed and (tmp_path / "backup/vhosts/v/queues/q.journal").exists():
            os.replace(queues / "q.journal.tmp", queues / "q.journal")
            renamed.append(True)

    target = tmp_path / "backup"
    target.mkdir()
    TreeCopier(str(data_dir), str(target), links=True, between=between).run()
    assert renamed
    assert (target / "vhosts/v/queues/q.journal").read_bytes() == b"compacted"


def test_the_replay_never_writes_through_a_link(
    data_dir: Path, tmp_path: Path, tap: FileTap
) -> None:
    """Changes recorded after the copy began are replayed over the copy; one that writes
    to a linked file (none should: sealed files are final) first replaces the link."""
    target = tmp_path / "backup"
    target.mkdir()
    copier = TreeCopier(str(data_dir), str(target), links=True, between=lambda: None)
    counts = copier.run()
    log = data_dir / "vhosts" / "v" / "messages"
    active = files.open_fd(str(log / "00000000000000000100.seg"), os.O_WRONLY)
    files.pwrite(active, b"+more", 6)
    files.close_fd(active)
    # A write to a sealed segment (the test's doing; the broker never does), recorded,
    # then undone behind the tap's back: a replay through the link would redo it here.
    sealed_path = log / "00000000000000000000.seg"
    sealed = files.open_fd(str(sealed_path), os.O_WRONLY)
    files.pwrite(sealed, b"XX", 0)
    files.close_fd(sealed)
    with open(sealed_path, "r+b") as undo:
        undo.write(b"se")
    files.remove(str(data_dir / "vhosts/v/queues/q.journal"))
    applier = SnapshotApplier(str(target), copier.linked, counts)
    applier.feed(tap.read(0, TAP_READ_MAX))
    applier.sync()
    applier.close()
    copied = target / "vhosts/v/messages"
    assert (copied / "00000000000000000100.seg").read_bytes() == b"active+more"
    assert (copied / "00000000000000000000.seg").read_bytes() == b"XX" + (b"sealed" * 100)[2:]
    assert sealed_path.read_bytes() == b"sealed" * 100
    assert not (target / "vhosts/v/queues/q.journal").exists()
    assert counts.links_broken == 1
    assert os.stat(copied / "00000000000000000000.seg").st_nlink == 1


def test_a_linked_file_renamed_in_the_copy_stays_linked_under_its_new_name(
    data_dir: Path, tmp_path: Path, tap: FileTap
) -> None:
    target = tmp_path / "backup"
    target.mkdir()
    copier = TreeCopier(str(data_dir), str(target), links=True, between=lambda: None)
    counts = copier.run()
    vhost = data_dir / "vhosts" / "v"
    files.replace(str(vhost), str(data_dir / "vhosts" / "v.deleted"))
    applier = SnapshotApplier(str(target), copier.linked, counts)
    applier.feed(tap.read(0, TAP_READ_MAX))
    applier.close()
    assert "vhosts/v.deleted/messages/00000000000000000000.seg" in applier.linked
    assert not any(path.startswith("vhosts/v/") for path in applier.linked)


def test_a_stopped_broker_is_copied_with_a_manifest(data_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "new" / "backup"
    manifest = copy_stopped(str(data_dir), str(target), links=True)
    assert manifest["online"] is False and manifest["files_linked"] == 2
    assert (target / "streamq-backup.json").exists()
    assert (target / "vhosts/v/messages/00000000000000000100.seg").read_bytes() == b"active"
