"""The queue journal: what a restart rebuilds from it, entries merged in the buffer,
torn and corrupt files, compaction, and version 2 files."""

from __future__ import annotations

import os
import struct
from array import array
from pathlib import Path

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamq.log.files import write_all
from streamq.log.versions import NewerFormat
from streamq.queues.classic import ClassicQueue, ReadyMessage
from streamq.queues.journal import (
    ACK,
    BLOCK,
    DEAD,
    DELIVER,
    ENQUEUE,
    ENTRY_BYTES,
    FLAG_EXPIRING,
    HEADER,
    MAGIC,
    JournalCorrupted,
    QueueJournal,
    dead_mark,
    dead_of,
    encode_block,
    encode_header,
    replay,
)

Entry = tuple[int, int, int, int]  # kind, first, count, value


def words(*entries: Entry, flags: int = 0) -> array[int]:
    """Version 3 entries as u64 words: first | flags << 48 | kind << 56, count, value."""
    result = array("Q")
    for kind, first, count, value in entries:
        result.extend((first | flags << 48 | kind << 56, count, value))
    return result


def blocks(*groups: list[Entry]) -> bytes:
    """A version 4 file: the header, then one block per group of entries."""
    return encode_header() + b"".join(encode_block(words(*group)) for group in groups)


def entries_of(journal: QueueJournal) -> list[Entry]:
    """The buffered entries, decoded by hand."""
    buffered = journal._buffer.tolist()
    return [
        (head >> 56, head & ((1 << 48) - 1), count, value)
        for head, count, value in zip(buffered[::3], buffered[1::3], buffered[2::3], strict=True)
    ]


def flush(journal: QueueJournal) -> None:
    """What a sync round does with the journal, minus the fdatasync."""
    fd, action, data = journal.prepare_sync()
    if fd is not None and data:
        write_all(fd, data)
    if action is not None:
        action()


def durable_queue(path: str) -> tuple[ClassicQueue, QueueJournal]:
    journal = QueueJournal.create(path, set())
    cursor = ClassicQueue(journal)
    journal.live_source = lambda: cursor.live_snapshot(False)
    return cursor, journal


def deliver(cursor: ClassicQueue, size: int) -> ReadyMessage:
    ready = cursor.take()
    assert ready is not None
    cursor.delivered(ready.offset, size)
    return ready


# -- replay of version 3 ----------------------------------------------------------------


def test_replay_of_runs_keeps_what_is_held_with_delivery_counts_and_bytes() -> None:
    data = blocks(
        [(ENQUEUE, 10, 5, 500), (ENQUEUE, 20, 3, 30)],
        [(DELIVER, 10, 3, 1), (ACK, 10, 1, 100)],
        [(DELIVER, 11, 1, 2), (DELIVER, 20, 1, 1), (ACK, 13, 1, 100)],
    )
    result = replay("j", data, 0, 100)
    assert result.runs == [(11, 2), (14, 1), (20, 3)]
    assert result.counts == {11: 2, 12: 1, 20: 1}
    assert result.size_bytes == 500 + 30 - 200 and result.size_exact
    assert result.message_count == 6 and not result.expiring
    assert result.entries == 7 and result.discarded == 0 and result.valid_bytes == len(data)
    assert result.version == 4


def test_the_expiring_flag_survives_a_replay() -> None:
    data = encode_header() + encode_block(words((ENQUEUE, 0, 2, 2), flags=FLAG_EXPIRING))
    assert replay("j", data, 0, 10).expiring


def test_an_empty_or_headerless_file_is_an_empty_queue() -> None:
    for data in (b"", encode_header()[:7], encode_header()):
        result = replay("j", data, 0, 10)
        assert (result.runs, result.counts, result.size_bytes, result.size_exact) == (
            [],
            {},
            0,
            True,
        )


def test_entries_outside_the_log_are_discarded_and_the_bytes_marked_inexact() -> None:
    """After a torn log tail, offsets at or past its end may be given to new messages: an
    old ack for such an offset must not remove a new message, nor an old enqueue add one."""
    data = blocks(
        [(ENQUEUE, 1, 3, 30), (ENQUEUE, 8, 3, 30)],  # 1 below the start, 8.. past the end
        [(DELIVER, 3, 1, 4), (ACK, 9, 1, 10)],
    )
    result = replay("j", data, 2, 9)
    assert result.runs == [(2, 2), (8, 1)]
    assert result.counts == {3: 4}
    assert result.discarded == 3 and not result.size_exact
    in_range = replay("j", data, 0, 100)
    assert (
        in_range.discarded == 0
        and in_range.size_exact
        and in_range.runs == [(1, 3), (8, 1), (10, 1)]
    )


# -- the buffer -------------------------------------------------------------------------


def test_consecutive_entries_merge_in_the_buffer(tmp_path: Path) -> None:
    cursor, journal = durable_queue(str(tmp_path / "q.journal"))
    for offset in range(5):
        cursor.enqueue(offset, 10 + offset)
    cursor.enqueue_run(5, 3, 30, None)
    cursor.enqueue(8, 1, expiring=True)  # another flag: an entry of its own
    cursor.enqueue(10, 1, expiring=True)  # not continuing offset 8
    assert entries_of(journal) == [(ENQUEUE, 0, 8, 90), (ENQUEUE, 8, 1, 1), (ENQUEUE, 10, 1, 1)]
    del journal._buffer[:]
    for _ in range(4):
        deliver(cursor, 10)
    first, count = cursor.take_run(3)
    cursor.delivered_run(first, [1] * count)
    for offset in range(7):
        cursor.ack(offset)  # per-message acks, in order
    assert entries_of(journal) == [(DELIVER, 0, 7, 1), (ACK, 0, 7, 43)]
    journal.close()


def test_a_delivery_with_another_count_does_not_merge(tmp_path: Path) -> None:
    cursor, journal = durable_queue(str(tmp_path / "q.journal"))
    cursor.enqueue_run(0, 3, 3, None)
    del journal._buffer[:]
    deliver(cursor, 1)
    cursor.requeue(0)
    deliver(cursor, 1)  # offset 0 again, its second delivery
    deliver(cursor, 1)
    deliver(cursor, 1)
    assert entries_of(journal) == [(DELIVER, 0, 1, 1), (DELIVER, 0, 1, 2), (DELIVER, 1, 2, 1)]
    journal.close()


def test_delivery_counts_after_a_restart(tmp_path: Path) -> None:
    """Fresh deliveries count 1, redeliveries their count; what was in flight is ready
    again after the restart, redelivered, ahead of the never-delivered."""
    path = str(tmp_path / "q.journal")
    cursor, journal = durable_queue(path)
    cursor.enqueue_run(0, 6, 60, None)
    for _ in range(3):
        deliver(cursor, 10)  # 0, 1, 2
    cursor.requeue(1)
    deliver(cursor, 10)  # 1, second time
    cursor.requeue(1)
    deliver(cursor, 10)  # 1, third time
    cursor.ack(0)
    cursor.requeue(2)  # ready, delivered once
    flush(journal)
    journal.close()
    loaded, result = QueueJournal.load(path, 0, 100, set())
    loaded.close()
    assert result.runs == [(1, 5)]
    assert result.counts == {1: 3, 2: 1}
    assert result.size_bytes == 50 and result.size_exact
    restored = ClassicQueue()
    restored.restore_runs(result.runs, result.counts)
    assert [restored.take() for _ in range(3)] == [
        ReadyMessage(1, True, 3),
        ReadyMessage(2, True, 1),
        ReadyMessage(3, False, 0),
    ]


# -- torn and corrupt files -------------------------------------------------------------

TORN_FILE_GROUPS: list[list[Entry]] = [
    [(ENQUEUE, 1, 2, 20)],
    [(ACK, 1, 1, 10), (ENQUEUE, 3, 1, 10)],
]
LAST_BLOCK_BYTES = BLOCK.size + 2 * ENTRY_BYTES


@pytest.mark.parametrize("cut", range(1, LAST_BLOCK_BYTES + 1))
def test_a_torn_last_block_is_ignored_at_every_byte(tmp_path: Path, cut: int) -> None:
    path = tmp_path / "q.journal"
    data = blocks(*TORN_FILE_GROUPS)
    path.write_bytes(data[:-cut])
    journal, result = QueueJournal.load(str(path), 0, 10, set())
    # the block with the ack of offset 1 is torn (or gone whole): offset 1 is still held
    assert result.runs == [(1, 2)] and result.size_bytes == 20 and result.size_exact
    assert result.valid_bytes == len(data) - LAST_BLOCK_BYTES
    # New blocks must follow valid ones: what is appended after the load is read back.
    journal.acked_run(2, 1, 10)
    flush(journal)
    journal.close()
    again = replay(str(path), path.read_bytes(), 0, 10)
    assert again.runs == [(1, 1)] and again.size_bytes == 10
    assert again.valid_bytes == path.stat().st_size


def test_a_bad_block_before_the_last_is_corruption(tmp_path: Path) -> None:
    path = tmp_path / "q.journal"
    data = bytearray(blocks([(ENQUEUE, 1, 2, 2)], [(ENQUEUE, 3, 1, 1)]))
    data[HEADER.size + BLOCK.size + 3] ^= 0x10  # a bit flip in the first entry's offset
    path.write_bytes(bytes(data))
    with pytest.raises(JournalCorrupted, match="at byte 16") as raised:
        QueueJournal.load(str(path), 0, 10, set())
    assert raised.value.position == HEADER.size
    assert path.read_bytes() == bytes(data)  # kept as it was, for operators


def test_an_entry_of_unknown_kind_is_corruption() -> None:
    data = blocks([(ENQUEUE, 1, 1, 1)], [(7, 1, 1, 1)])
    with pytest.raises(JournalCorrupted, match="unknown kind 7"):
        replay("j", data, 0, 10)


@pytest.mark.parametrize(
    "header",
    [b"XXXX" + bytes(12), struct.pack("<4sHHQ", MAGIC, 1, 0, 0)],
    ids=["magic", "version"],
)
def test_a_bad_header_is_corruption(tmp_path: Path, header: bytes) -> None:
    path = tmp_path / "q.journal"
    path.write_bytes(header)
    with pytest.raises(JournalCorrupted, match="bad header"):
        QueueJournal.load(str(path), 0, 10, set())


def test_a_newer_version_is_refused_naming_both(tmp_path: Path) -> None:
    path = tmp_path / "q.journal"
    path.write_bytes(struct.pack("<4sHHQ", MAGIC, 5, 0, 0))
    with pytest.raises(NewerFormat, match=r"queue journal format version 5 .* up to 4"):
        QueueJournal.load(str(path), 0, 10, set())


# -- dead letters held (at-least-once dead-lettering) ----------------------------------


def test_a_dead_mark_keeps_its_reason_and_time() -> None:
    for reason in ("expired", "rejected", "delivery_limit", "maxlen"):
        assert dead_of(dead_mark(reason, 1_790_000_000)) == (reason, 1_790_000_000)


def test_dead_letters_held_replay_with_their_marks_until_acked() -> None:
    mark = dead_mark("rejected", 1234)
    data = blocks(
        [(ENQUEUE, 1, 5, 50), (DELIVER, 2, 2, 1)],
        [(DEAD, 2, 2, mark), (DEAD, 4, 1, dead_mark("expired", 99))],
        [(ACK, 3, 1, 10)],  # the target has the copy of 3: released
    )
    result = replay("j", data, 0, 10)
    assert result.runs == [(1, 2), (4, 2)] and result.size_bytes == 40
    assert dict(result.dead) == {2: mark, 4: dead_mark("expired", 99)}


def test_a_version_3_file_knows_no_dead_entries() -> None:
    data = struct.pack("<4sHHQ", MAGIC, 3, 0, 0) + encode_block(
        words((ENQUEUE, 1, 1, 1), (DEAD, 1, 1, 1))
    )
    with pytest.raises(JournalCorrupted, match="unknown kind 4"):
        replay("j", data, 0, 10)


def test_a_version_3_file_is_read_and_rewritten_in_version_4(tmp_path: Path) -> None:
    path = tmp_path / "q.journal"
    path.write_bytes(
        struct.pack("<4sHHQ", MAGIC, 3, 0, 0) + encode_block(words((ENQUEUE, 1, 3, 30)))
    )
    journal, result = QueueJournal.load(str(path), 0, 10, set())
    journal.close()
    assert result.version == 3 and result.runs == [(1, 3)]
    again = replay(str(path), path.read_bytes(), 0, 10)
    assert again.version == 4 and again.runs == [(1, 3)] and again.size_bytes == 30


def test_dead_letters_survive_compaction_and_restore_out_of_the_ready_order(
    tmp_path: Path,
) -> None:
    """A cursor holds one message as a dead letter in flight and one taken from the
    ready order; after a compaction and a load, both are marked, and restoring them
    leaves only the others ready."""
    path = str(tmp_path / "q.journal")
    cursor, journal = durable_queue(path)
    for offset in range(4):
        cursor.enqueue(offset, 10)
    ready = deliver(cursor, 10)  # 0 in flight
    assert cursor.hold_dead(ready.offset, None, dead_mark("rejected", 5))
    assert not cursor.hold_dead(ready.offset, None, dead_mark("rejected", 5))
    taken = cursor.take()
    assert taken is not None and taken.offset == 1
    cursor.hold_dead(1, 10, dead_mark("expired", 6))
    assert cursor.message_count == 2 and cursor.unacked_count == 0 and cursor.bytes_dead == 20
    assert cursor.low_water_offset() == 0
    journal.request_compaction()
    flush(journal)
    cursor.release_dead(0)
    flush(journal)
    journal.close()
    loaded, result = QueueJournal.load(path, 0, 10, set())
    loaded.close()
    assert dict(result.dead) == {1: dead_mark("expired", 6)}
    assert result.runs == [(1, 3)] and result.size_bytes == 30
    restored = ClassicQueue()
    restored.restore_runs(result.runs, dict(result.counts))
    restored.bytes_ready = result.size_bytes
    assert restored.restore_dead(1, 10, result.dead[1])
    assert restored.message_count == 2 and restored.bytes_ready == 20
    assert [restored.take(), restored.take(), restored.take()] == [
        ReadyMessage(2, False, 0),
        ReadyMessage(3, False, 0),
        None,
    ]


# -- compaction -------------------------------------------------------------------------


def test_compaction_replaces_the_file_with_the_live_runs(tmp_path: Path) -> None:
    path = str(tmp_path / "q.journal")
    cursor, journal = durable_queue(path)
    for offset in range(100):
        cursor.enqueue(offset, 1)
        flush(journal)  # one block per message: the file grows
    for _ in range(90):
        ready = deliver(cursor, 1)
        cursor.ack(ready.offset)
        flush(journal)
    ready = deliver(cursor, 1)  # 90, in flight
    cursor.requeue(ready.offset)
    before = os.path.getsize(path)
    journal.request_compaction()
    cursor.enqueue(100, 1)  # recorded before the round: part of the snapshot
    flush(journal)
    after = os.path.getsize(path)
    # one ENQUEUE run (90 .. 100) and one DELIVER entry (90, delivered once)
    assert after == HEADER.size + BLOCK.size + 2 * ENTRY_BYTES < before
    cursor.enqueue(101, 1)  # after the round: appended to the new file
    flush(journal)
    journal.close()
    assert not os.path.exists(path + ".tmp")
    loaded, result = QueueJournal.load(path, 0, 200, set())
    loaded.close()
    assert result.runs == [(90, 12)] and result.counts == {90: 1}
    assert result.size_bytes == 12 and result.size_exact


def test_a_queue_deleted_during_its_compaction_does_not_get_its_file_back(
    tmp_path: Path,
) -> None:
    """The compaction's rename runs on the fsync thread; a queue deleted (journal closed
    and unlinked) before it runs must stay without a file, or a new queue of the same
    name would inherit the old one's messages."""
    path = str(tmp_path / "q.journal")
    cursor, journal = durable_queue(path)
    cursor.enqueue(1, 1)
    flush(journal)
    journal.request_compaction()
    _, action, _ = journal.prepare_sync()
    assert action is not None
    journal.close()
    os.unlink(path)
    action()
    assert not os.path.exists(path)


# -- version 2 files --------------------------------------------------------------------


def v2_file(*groups: list[tuple[int, int, int]]) -> bytes:
    """A version 2 file, by hand: header with version 2, then blocks of u64 entries
    offset | kind << 48 | count << 50 (kind 1 ENQUEUE, 2 DELIVER, 3 ACK)."""
    data = struct.pack("<4sHHQ", b"SQQJ", 2, 0, 0)
    for group in groups:
        payload = b"".join(struct.pack("<Q", o | k << 48 | c << 50) for o, k, c in group)
        data += struct.pack("<II", len(group), crc32c.crc32c(payload)) + payload
    return data


V2_ENQUEUE, V2_DELIVER, V2_ACK = 1, 2, 3


def test_a_version_2_file_is_read_with_the_same_offsets_and_counts(tmp_path: Path) -> None:
    data = v2_file(
        [(o, V2_ENQUEUE, 0) for o in range(5, 10)],
        [(5, V2_DELIVER, 1), (6, V2_DELIVER, 1), (5, V2_ACK, 0)],
        [(6, V2_DELIVER, 3), (8, V2_DELIVER, 1), (12, V2_ENQUEUE, 0)],
    )
    path = tmp_path / "q.journal"
    path.write_bytes(data)
    journal, result = QueueJournal.load(str(path), 0, 100, set())
    journal.close()
    assert result.version == 2 and result.entries == 11
    assert result.runs == [(6, 4), (12, 1)]
    assert result.counts == {6: 3, 8: 1}
    assert not result.size_exact  # sizes were not kept: the vhost counts them from the log
    assert replay("j", data, 7, 100).runs == [(7, 3), (12, 1)]


def test_a_version_2_file_rewritten_with_its_byte_total_reads_as_version_4(
    tmp_path: Path,
) -> None:
    path = tmp_path / "q.journal"
    path.write_bytes(v2_file([(1, V2_ENQUEUE, 0), (2, V2_ENQUEUE, 0), (2, V2_DELIVER, 2)]))
    journal, result = QueueJournal.load(str(path), 0, 100, set())
    journal.rewrite(result, 77, False)
    journal.acked_run(1, 1, 7)
    flush(journal)
    journal.close()
    again = replay(str(path), path.read_bytes(), 0, 100)
    assert again.version == 4 and again.size_exact
    assert (again.runs, again.counts, again.size_bytes) == ([(2, 1)], {2: 2}, 70)


# -- a round trip -----------------------------------------------------------------------


def test_cursor_journal_load_restore_round_trip(tmp_path: Path) -> None:
    """A cursor's history through its journal (several sync rounds, a purge, acks in
    bulk and singly, expiries) against the restored cursor: the same ready order, counts
    and byte total, messages in flight coming back as redelivered."""
    path = str(tmp_path / "q.journal")
    cursor, journal = durable_queue(path)
    cursor.enqueue_run(0, 20, 200, None)
    cursor.purge()
    cursor.enqueue_run(20, 30, 30 * 7, None)
    cursor.enqueue_run(60, 10, 10 * 7, None)
    flush(journal)
    first, count = cursor.take_run(12)
    cursor.delivered_run(first, [7] * 8)
    cursor.untake_run(first + 8, count - 8)
    cursor.ack_many([21, 22, 23])
    cursor.requeue(25)
    cursor.requeue(20)
    flush(journal)
    deliver(cursor, 7)  # 20, again
    assert cursor.take_expired(lambda offset: offset == 25) == [25]
    cursor.dropped(25, 7)
    cursor.ack(24)
    deliver(cursor, 7)  # 28, a first delivery
    flush(journal)
    journal.close()

    expected_ready = sorted([*cursor.unacked, *expand_requeued(cursor)])
    expected_ready += [o for o in expand(cursor.ready_runs()) if cursor.delivery_count(o) == 0]
    held = expand(cursor.held_runs())
    expected_counts = {o: cursor.delivery_count(o) for o in held if cursor.delivery_count(o)}
    expected_bytes = cursor.bytes_ready + cursor.bytes_unacked

    loaded, result = QueueJournal.load(path, 0, 100, set())
    loaded.close()
    assert result.size_exact and result.size_bytes == expected_bytes
    assert result.counts == expected_counts
    restored = ClassicQueue()
    restored.restore_runs(result.runs, result.counts)
    restored.bytes_ready = result.size_bytes
    assert expand(restored.ready_runs()) == expected_ready
    assert [restored.delivery_count(o) for o in held] == [expected_counts.get(o, 0) for o in held]
    assert restored.message_count == len(held)
    assert restored.run_count == 2  # 29 and the rest of the run, 30 .. 49 and 60 .. 69


def expand(runs: list[tuple[int, int]]) -> list[int]:
    return [offset for first, count in runs for offset in range(first, first + count)]


def expand_requeued(cursor: ClassicQueue) -> list[int]:
    """The ready offsets delivered before (requeued)."""
    return [o for o in expand(cursor.ready_runs()) if cursor.delivery_count(o)]


round_trip_ops = st.lists(
    st.tuples(
        st.sampled_from(
            ["enqueue", "deliver", "run", "ack", "ack_many", "requeue", "drop", "purge"]
        ),
        st.integers(0, 7),
        st.booleans(),  # a sync round after the step
    ),
    max_size=40,
)


@settings(max_examples=100, derandomize=True, deadline=None)
@given(ops=round_trip_ops)
def test_any_history_round_trips_through_the_journal(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, int, bool]]
) -> None:
    """Random histories of a durable cursor, synced now and then: the restored cursor
    holds what the first held, in flight or ready, in the order a restart gives (those
    delivered before, by offset, then the never-delivered), with the same counts and
    byte total."""
    path = str(tmp_path_factory.mktemp("j") / "q.journal")
    cursor, journal = durable_queue(path)
    next_offset = 0
    for tag, n, sync in ops:
        unacked = sorted(cursor.unacked)
        if tag == "enqueue":
            next_offset += n % 2  # a gap now and then
            cursor.enqueue_run(next_offset, n + 1, (n + 1) * 3, None)
            next_offset += n + 1
        elif tag == "deliver" and (ready := cursor.take()) is not None:
            cursor.delivered(ready.offset, 3)
        elif tag == "run":
            first, count = cursor.take_run(n + 1)
            sent = (count + 1) // 2
            cursor.delivered_run(first, [3] * sent)
            cursor.untake_run(first + sent, count - sent)
        elif tag == "ack" and unacked:
            cursor.ack(unacked[n % len(unacked)])
        elif tag == "ack_many" and unacked:
            cursor.ack_many(unacked[n % len(unacked) :])
        elif tag == "requeue" and unacked:
            cursor.requeue(unacked[n % len(unacked)])
        elif tag == "drop" and (ready := cursor.take()) is not None:
            cursor.dropped(ready.offset, 3)
        elif tag == "purge":
            cursor.purge()
        if sync:
            flush(journal)
    flush(journal)
    journal.close()
    held = expand(cursor.held_runs())
    counts = {o: cursor.delivery_count(o) for o in held if cursor.delivery_count(o)}
    expected_ready = sorted(counts) + [o for o in held if o not in counts]

    loaded, result = QueueJournal.load(path, 0, next_offset + 1, set())
    loaded.close()
    assert result.size_exact and result.size_bytes == cursor.bytes_ready + cursor.bytes_unacked
    assert result.counts == counts
    restored = ClassicQueue()
    restored.restore_runs(result.runs, result.counts)
    assert expand(restored.ready_runs()) == expected_ready
    assert [restored.delivery_count(o) for o in held] == [counts.get(o, 0) for o in held]
