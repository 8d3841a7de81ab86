"""The delayed-message store: deadline order, the file's replay (torn tails cut at every
byte), removals written only after the round that follows a release, and compaction."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from streamq.broker.delayed import (
    COMPACT_DEAD_MIN,
    HEADER,
    MAGIC,
    VERSION,
    DelayedMessage,
    DelayedStore,
    encode_add,
    encode_remove,
    replay,
)


def run_round(store: DelayedStore) -> None:
    """What a sync round does with the companion's work (fsync skipped)."""
    work = store.prepare_sync()
    for action in work.actions:
        action()


def message(seq: int, deadline_ms: int = 100) -> DelayedMessage:
    return DelayedMessage(seq, deadline_ms, "ex", "rk", b"\x00\x00", b"body %d" % seq, True)


def test_due_in_deadline_order_and_next_deadline(tmp_path: Path) -> None:
    store = DelayedStore.open(str(tmp_path / "delayed"))
    assert store.add("ex", "a", b"", b"3", 300, persistent=False)
    assert store.add("ex", "a", b"", b"1", 100, persistent=False)
    assert not store.add("ex", "a", b"", b"2", 200, persistent=False)
    assert store.next_deadline_ms() == 100
    assert [m.body for m in store.due(250)] == [b"1", b"2"]
    assert store.next_deadline_ms() == 300
    assert store.drop_exchange("ex") == 1
    assert store.next_deadline_ms() is None
    store.close()


def test_persistent_messages_come_back_and_removals_wait_a_round(tmp_path: Path) -> None:
    path = str(tmp_path / "delayed")
    store = DelayedStore.open(path)
    store.add("ex", "k", b"p", b"kept", 500, persistent=True)
    store.add("ex", "k", b"p", b"released", 100, persistent=True)
    store.add("ex", "k", b"p", b"transient", 100, persistent=False)
    assert store.unsynced
    run_round(store)
    assert [m.body for m in store.due(200)] == [b"released", b"transient"]
    run_round(store)  # the round that makes the release's publish durable: no REMOVE yet
    on_disk = replay(Path(path).read_bytes())[0].values()
    assert {m.body for m in on_disk} == {b"kept", b"released"}
    assert store.dirty
    run_round(store)
    assert not store.dirty
    os.close(store._fd)  # a crash: nothing more is written
    reopened = DelayedStore.open(path)
    assert [(m.body, m.deadline_ms) for m in reopened.messages()] == [(b"kept", 500)]
    reopened.close()


def test_close_writes_pending_removals(tmp_path: Path) -> None:
    path = str(tmp_path / "delayed")
    store = DelayedStore.open(path)
    store.add("ex", "k", b"", b"x", 1, persistent=True)
    run_round(store)
    assert len(store.due(10)) == 1
    store.close()
    assert DelayedStore.open(path).messages() == []


def test_a_torn_tail_is_cut_at_every_byte(tmp_path: Path) -> None:
    whole = HEADER.pack(MAGIC, VERSION, 0) + encode_add(message(1)) + encode_add(message(2))
    last = len(whole) - len(encode_add(message(2)))
    for cut in range(last, len(whole)):
        path = tmp_path / f"delayed-{cut}"
        path.write_bytes(whole[:cut])
        store = DelayedStore.open(str(path))
        assert [m.seq for m in store.messages()] == [1]
        store.close()
        assert replay(path.read_bytes()) == ({1: message(1)}, True)  # rewritten clean


def test_a_foreign_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "delayed"
    path.write_bytes(b"NOPE" + bytes(20))
    with pytest.raises(ValueError, match="not a delayed-messages file"):
        DelayedStore.open(str(path))


def test_removals_replay_and_compaction_keeps_the_live_ones(tmp_path: Path) -> None:
    data = HEADER.pack(MAGIC, VERSION, 0) + encode_add(message(1)) + encode_remove(1)
    assert replay(data) == ({}, False)
    path = str(tmp_path / "delayed")
    store = DelayedStore.open(path)
    store.add("ex", "k", b"", b"live", 10**12, persistent=True)
    for n in range(COMPACT_DEAD_MIN):
        store.add("ex", "k", b"", b"%d" % n, n, persistent=True)
    run_round(store)
    assert len(store.due(COMPACT_DEAD_MIN)) == COMPACT_DEAD_MIN
    run_round(store)
    run_round(store)  # REMOVE records: enough dead ones to compact
    run_round(store)
    size = os.path.getsize(path)
    assert size < 200, size
    store.add("ex", "k", b"", b"later", 10**12 + 1, persistent=True)
    run_round(store)
    store.close()
    reopened = DelayedStore.open(path)
    assert sorted(m.body for m in reopened.messages()) == [b"later", b"live"]
    reopened.close()
