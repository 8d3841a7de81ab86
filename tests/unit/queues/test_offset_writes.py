"""The writes of stored offsets on a full disk: held, in order, newest value winning,
never dropped and never left in part.

Method: a real 1 MiB tmpfs mounted for each test and filled to its last byte by a file the
test creates, then deletes; the store's round action runs as a sync round runs it (on this
thread here), no mock of our own code. Hundreds of records need more than the page the
file's last block may still have free, so the append really finds no room.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from streamq.log.errors import OutOfSpace
from streamq.queues.offset_file import decode_file
from streamq.queues.offsets import OffsetStore
from tests.small_fs import fill, small_filesystem

TAGS = [f"consumer-{n:03}" for n in range(300)]
TRIES = 40
# A moment after handing an action over: inside its append and fdatasync, which take
# longer (the window a store must hit to test what happens to it).
INTO_THE_WRITE_S = 0.0002
THREAD_TIMEOUT_S = 60


@pytest.fixture
def fs(tmp_path: Path) -> Iterator[Path]:
    with small_filesystem(tmp_path / "fs", "1m") as mounted:
        yield mounted


def on_disk(path: Path) -> dict[str, int]:
    """The offsets the file holds; fails on a torn or damaged record."""
    data = path.read_bytes()
    decoded = decode_file(str(path), data)
    assert decoded.valid_bytes == len(data) and not decoded.damaged, "a partial record"
    return decoded.offsets


def test_a_full_disk_holds_the_offsets_and_the_newest_land_once_there_is_room(
    fs: Path,
) -> None:
    path = fs / "s.offsets"
    store = OffsetStore.open(str(path))
    store.store("early", 1)
    (action,) = store.prepare_sync().actions
    action()
    filler = fill(fs / "filler", leave_bytes=0)

    for tag in TAGS:
        store.store(tag, 10)
    (action,) = store.prepare_sync().actions
    with pytest.raises(OutOfSpace):
        action()
    assert on_disk(path) == {"early": 1}  # cut back: nothing of it, no partial record
    assert not store.settled()

    # Newer stores while the write waits: the same action (the log runs it again) takes
    # them, the newest of each tag; no second action, no second copy in memory.
    for value in (20, 30):
        for tag in TAGS:
            store.store(tag, value)
        assert store.prepare_sync().actions == ()
    with pytest.raises(OutOfSpace):
        action()
    assert store.get(TAGS[-1]) == 30

    filler.unlink()
    action()
    assert store.settled()
    assert on_disk(path) == {"early": 1, **dict.fromkeys(TAGS, 30)}
    store.store("early", 2)
    (action,) = store.prepare_sync().actions  # the next store has an action again
    action()
    store.close()
    again = OffsetStore.open(str(path))
    assert [again.get(tag) for tag in ("early", *TAGS)] == [2, *[30] * len(TAGS)]
    again.close()


def test_a_store_opened_on_a_full_disk_creates_its_file_with_its_first_write(
    fs: Path,
) -> None:
    """A restart on a full disk opens the store (nothing to write yet); its first write,
    once there is room, creates the file whole."""
    filler = fill(fs / "filler", leave_bytes=0)
    path = fs / "new.offsets"
    store = OffsetStore.open(str(path))
    assert not path.exists()
    store.store("a", 5)
    (action,) = store.prepare_sync().actions
    with pytest.raises(OutOfSpace):
        action()
    assert not path.exists()
    filler.unlink()
    action()
    store.close()
    assert on_disk(path) == {"a": 5}


def test_offsets_stored_while_a_write_runs_are_written_by_a_later_round(
    tmp_path: Path,
) -> None:
    """A store that lands while a write is under way (after the write took its copy of
    the held offsets) must get an action from a later round: none may stay held with no
    action to write it. The actions run on another thread, as on the Syncer; each try
    stores again a moment after handing one over, while its append and fdatasync run."""
    path = tmp_path / "s.offsets"
    store = OffsetStore.open(str(path))
    actions: queue.Queue[Callable[[], None] | None] = queue.Queue()

    def syncer() -> None:
        while (action := actions.get()) is not None:
            action()
            actions.task_done()

    thread = threading.Thread(target=syncer, daemon=True)
    thread.start()
    try:
        for n in range(0, 2 * TRIES, 2):
            store.store("c", n)
            (action,) = store.prepare_sync().actions
            actions.put(action)
            time.sleep(INTO_THE_WRITE_S)
            store.store("c", n + 1)
            for action in store.prepare_sync().actions:  # none if still under way
                actions.put(action)
            actions.join()
            for _ in range(2):  # the rounds that follow write what it left
                for later in store.prepare_sync().actions:
                    later()
            assert store.settled(), f"try {n // 2}: an offset held with no action"
            assert on_disk(path) == {"c": n + 1}
    finally:
        actions.put(None)
        thread.join(timeout=THREAD_TIMEOUT_S)
    store.close()
