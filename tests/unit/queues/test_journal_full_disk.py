"""A queue journal opened on a full disk: kept and read as it is, compacted later.

Method: a real 1 MiB tmpfs mounted for each test (tests/small_fs.py), filled to the
last byte after the journal is written; no mock. `QueueJournal.load` must not raise,
must cut a torn last block in place and return what the file holds; the first
`prepare_sync` after room returns compacts it (one block of the live entries).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamq.log.errors import OutOfSpace
from streamq.queues.journal import ENTRY_BYTES, HEADER, LiveSnapshot, QueueJournal, replay
from tests.small_fs import fill, free_bytes, small_filesystem

MESSAGES = 100


@pytest.fixture
def fs(tmp_path: Path) -> Iterator[Path]:
    with small_filesystem(tmp_path / "fs", "1m") as mounted:
        yield mounted


def written(path: str) -> None:
    """A journal of MESSAGES one-entry blocks (one per round), and a torn block after."""
    dirty: set[QueueJournal] = set()
    journal = QueueJournal.create(path, dirty)
    for offset in range(MESSAGES):
        journal.enqueued_run(offset, 1, 10)
        fd, _, data = journal.prepare_sync()
        assert fd is not None
        os.write(fd, data)
    journal.close()
    with open(path, "ab") as file:
        file.write(b"\x01\x00\x00\x00torn")


def test_a_journal_loaded_on_a_full_disk_is_kept_then_compacted(fs: Path) -> None:
    path = str(fs / "q.journal")
    written(path)
    size = os.path.getsize(path)
    filler = fill(fs / "filler", 0)
    assert free_bytes(fs) == 0

    dirty: set[QueueJournal] = set()
    journal, replayed = QueueJournal.load(path, 0, MESSAGES, dirty)
    assert replayed.runs == [(0, MESSAGES)] and replayed.size_bytes == 10 * MESSAGES
    assert os.path.getsize(path) == size - 8  # the torn block cut in place, nothing else
    assert not os.path.exists(path + ".tmp")
    assert dirty == {journal}  # compaction pending

    def snapshot() -> LiveSnapshot:
        return LiveSnapshot(replayed.runs, {}, replayed.size_bytes, False, {})

    journal.live_source = snapshot
    # Still full: the compaction's write finds no room and is held, the old file kept.
    fd, action, _ = journal.prepare_sync()
    assert fd is None and action is not None
    with pytest.raises(OutOfSpace):
        action()
    assert os.path.getsize(path) == size - 8
    filler.unlink()
    action()  # the round runs it again
    data = Path(path).read_bytes()
    assert len(data) == HEADER.size + 8 + ENTRY_BYTES
    again = replay(path, data, 0, MESSAGES)
    assert again.runs == [(0, MESSAGES)] and again.size_bytes == 10 * MESSAGES
    journal.close()
