"""The queue journal: what a restart rebuilds from it, torn and corrupt files, compaction."""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable
from pathlib import Path

import pytest

from streamq.log.files import write_all
from streamq.queues.classic import ClassicQueue
from streamq.queues.journal import (
    ACK,
    BLOCK,
    DELIVER,
    ENQUEUE,
    ENTRY_BYTES,
    HEADER,
    JournalCorrupted,
    LiveMessage,
    QueueJournal,
    encode_block,
    encode_header,
    entry,
    replay,
)
from streamq.queues.priority import PriorityQueue


def blocks(*groups: list[tuple[int, int, int]]) -> bytes:
    """A journal file: the header, then one block per group of (offset, kind, count)."""
    return encode_header() + b"".join(
        encode_block(array("Q", [entry(o, k, c) for o, k, c in group])) for group in groups
    )


def write(path: Path, *groups: list[tuple[int, int, int]]) -> bytes:
    data = blocks(*groups)
    path.write_bytes(data)
    return data


def flush(journal: QueueJournal) -> None:
    """What a sync round does with the journal, minus the fdatasync."""
    fd, action, data = journal.prepare_sync()
    if fd is not None and data:
        write_all(fd, data)
    if action is not None:
        action()


def test_replay_keeps_enqueued_unacked_offsets_with_their_delivery_counts() -> None:
    data = blocks(
        [(5, ENQUEUE, 0), (6, ENQUEUE, 0), (7, ENQUEUE, 0)],
        [(5, DELIVER, 1), (6, DELIVER, 1)],
        [(6, DELIVER, 2), (5, ACK, 0)],
    )
    result = replay("j", data, 0, 100)
    assert result.live == [LiveMessage(6, 2), LiveMessage(7, 0)]
    assert result.entries == 7 and result.discarded == 0 and result.valid_bytes == len(data)


def test_entries_outside_the_log_are_discarded() -> None:
    """After a torn log tail, offsets at or past its end may be given to new messages: an
    old ack for such an offset must not remove a new message, nor an old enqueue add one."""
    data = blocks([(1, ENQUEUE, 0), (2, ENQUEUE, 0), (9, ENQUEUE, 0), (3, ACK, 0)])
    result = replay("j", data, 2, 5)
    assert result.live == [LiveMessage(2, 0)]
    assert result.discarded == 2  # offsets 1 and 9; the ack of 3 is in range


LAST_BLOCK_BYTES = BLOCK.size + 2 * ENTRY_BYTES


@pytest.mark.parametrize("cut", range(1, LAST_BLOCK_BYTES + 1))
def test_a_torn_last_block_is_ignored_at_every_byte(tmp_path: Path, cut: int) -> None:
    path = tmp_path / "q.journal"
    data = write(path, [(1, ENQUEUE, 0), (2, ENQUEUE, 0)], [(1, ACK, 0), (3, ENQUEUE, 0)])
    path.write_bytes(data[:-cut])
    journal, live = QueueJournal.load(str(path), 0, 10, set())
    journal.close()
    # the block with the ack of offset 1 is torn (or gone whole): offset 1 is still held
    assert live == [LiveMessage(1, 0), LiveMessage(2, 0)]
    # the torn bytes are gone from the file, so that new blocks follow valid ones
    assert path.stat().st_size == len(data) - LAST_BLOCK_BYTES


def test_a_bad_entry_before_the_last_is_corruption(tmp_path: Path) -> None:
    path = tmp_path / "q.journal"
    data = bytearray(write(path, [(1, ENQUEUE, 0), (2, ENQUEUE, 0)], [(3, ENQUEUE, 0)]))
    data[HEADER.size + BLOCK.size + 3] ^= 0x10  # a bit flip in the first entry's offset
    path.write_bytes(bytes(data))
    with pytest.raises(JournalCorrupted, match="at byte 16"):
        QueueJournal.load(str(path), 0, 10, set())
    assert path.read_bytes() == bytes(data)  # kept as it was, for operators


def test_a_bad_header_is_corruption(tmp_path: Path) -> None:
    path = tmp_path / "q.journal"
    path.write_bytes(b"XXXX" + bytes(12))
    with pytest.raises(JournalCorrupted, match="bad header"):
        QueueJournal.load(str(path), 0, 10, set())


def test_a_cursor_records_enqueue_deliver_ack_and_purge(tmp_path: Path) -> None:
    dirty: set[QueueJournal] = set()
    path = str(tmp_path / "q.journal")
    journal = QueueJournal.create(path, dirty)
    cursor = ClassicQueue(journal)
    journal.live_source = cursor.live_snapshot
    for offset in range(4):
        cursor.enqueue(offset, 10)
    first = cursor.take()
    second = cursor.take()
    assert first is not None and second is not None
    cursor.requeue(second.offset)
    again = cursor.take()
    assert again is not None and again.offset == 1 and again.delivery_count == 1
    cursor.ack(first.offset)
    assert dirty == {journal}
    flush(journal)
    journal.close()
    _, live = QueueJournal.load(path, 0, 100, set())
    assert live == [LiveMessage(1, 2), LiveMessage(2, 0), LiveMessage(3, 0)]


def test_compaction_replaces_the_file_with_the_live_entries(tmp_path: Path) -> None:
    dirty: set[QueueJournal] = set()
    path = str(tmp_path / "q.journal")
    journal = QueueJournal.create(path, dirty)
    cursor = ClassicQueue(journal)
    journal.live_source = cursor.live_snapshot
    for offset in range(100):
        cursor.enqueue(offset, 1)
    for _ in range(90):
        taken = cursor.take()
        assert taken is not None
        cursor.ack(taken.offset)
    flush(journal)
    before = os.path.getsize(path)
    journal.request_compaction()
    cursor.enqueue(100, 1)  # recorded before the round: part of the snapshot
    flush(journal)
    after = os.path.getsize(path)
    assert after == HEADER.size + BLOCK.size + 11 * ENTRY_BYTES < before
    cursor.enqueue(101, 1)  # after the round: appended to the new file
    flush(journal)
    journal.close()
    assert not os.path.exists(path + ".tmp")
    _, live = QueueJournal.load(path, 0, 200, set())
    assert [m.offset for m in live] == [*range(90, 102)]


def test_a_queue_deleted_during_its_compaction_does_not_get_its_file_back(
    tmp_path: Path,
) -> None:
    """The compaction's rename runs on the fsync thread; a queue deleted (journal closed
    and unlinked) before it runs must stay without a file, or a new queue of the same
    name would inherit the old one's messages."""
    path = str(tmp_path / "q.journal")
    journal = QueueJournal.create(path, set())
    cursor = ClassicQueue(journal)
    journal.live_source = cursor.live_snapshot
    cursor.enqueue(1, 1)
    flush(journal)
    journal.request_compaction()
    _, action, _ = journal.prepare_sync()
    assert action is not None
    journal.close()
    os.unlink(path)
    action()
    assert not os.path.exists(path)


@pytest.mark.parametrize(
    "new_cursor",
    [ClassicQueue, lambda journal: PriorityQueue(2, journal)],
    ids=["classic", "priority"],
)
def test_ack_many_leaves_what_acks_one_by_one_leave(
    tmp_path: Path, new_cursor: Callable[[QueueJournal], ClassicQueue]
) -> None:
    """`ack_many` (an ack with `multiple`) against `ack` per offset: the same cursor
    state and the same journal entries, offsets already gone included."""
    states = []
    for name, bulk in (("one", False), ("many", True)):
        journal = QueueJournal.create(str(tmp_path / f"{name}.journal"), set())
        cursor = new_cursor(journal)
        for offset in range(20):
            cursor.enqueue(offset, 10 + offset, offset % 3)
        in_flight = [ready.offset for ready in iter(cursor.take, None)]
        for offset in in_flight[12:]:
            cursor.requeue(offset)  # back to ready: only 12 stay in flight
        taken = in_flight[:12]
        cursor.ack(taken[3])  # gone before the ack that names it again
        acked = [taken[3], *taken[5:11]]
        if bulk:
            cursor.ack_many(acked)
        else:
            for offset in acked:
                cursor.ack(offset)
        states.append(
            (
                sorted(cursor.unacked),
                cursor.offsets(),
                [cursor.delivery_count(o) for o in range(20)],
                journal._buffer.tolist(),
                journal._live,
                journal._dead,
            )
        )
        journal.close()
    assert states[0] == states[1]
    assert states[1][0] == sorted([*taken[:3], taken[4], taken[11]])
