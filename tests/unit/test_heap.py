"""The broker process's heap (streamq/heap.py): young collections far less often, the
older generations' rules and cycle collection as CPython's; freed memory handed back to
the kernel, once per rest.

Method: the real collector (each test restores the interpreter's thresholds) and glibc's
heap, measured in /proc/self/statm; RestTrim's CPU clock is a counter the test moves.
"""

from __future__ import annotations

import asyncio
import gc
import os
import weakref
from collections.abc import Iterator

import pytest

from streamq.heap import (
    REST_CPU_SHARE_MAX,
    YOUNG_THRESHOLD,
    RestTrim,
    return_freed_memory,
    tune_collector,
)


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture(autouse=True)
def thresholds() -> Iterator[None]:
    saved = gc.get_threshold()
    yield
    gc.set_threshold(*saved)


def test_only_the_young_threshold_changes() -> None:
    gc.set_threshold(700, 10, 10)
    assert tune_collector() == (700, 10, 10)
    assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)


def test_young_collections_wait_for_the_threshold_and_cycles_are_still_freed() -> None:
    tune_collector()
    gc.collect()
    start = gc.get_stats()[0]["collections"]
    keep = [Node() for _ in range(YOUNG_THRESHOLD // 2)]  # half the threshold: no collection
    assert gc.get_stats()[0]["collections"] == start
    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    keep += [Node() for _ in range(YOUNG_THRESHOLD)]  # past it: a young collection ran
    assert gc.get_stats()[0]["collections"] > start
    assert gone() is None
    assert len(keep) == YOUNG_THRESHOLD // 2 + YOUNG_THRESHOLD


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


CHUNK_BYTES = 64 * 1024  # below glibc's mmap threshold: from the heap
HEAP_CHUNKS = 800  # 50 MiB


def test_return_freed_memory_gives_back_memory_freed_amid_the_heap() -> None:
    # Free 50 MiB of heap blocks under one that stays: glibc returns free memory to the
    # kernel by itself only from the top of the heap, so the RSS keeps it until a trim.
    assert return_freed_memory()  # glibc here
    chunks = [bytearray(b"x" * CHUNK_BYTES) for _ in range(HEAP_CHUNKS)]
    top = bytearray(b"y" * CHUNK_BYTES)
    held = _rss_bytes()
    del chunks
    before = _rss_bytes()
    assert return_freed_memory()
    after = _rss_bytes()
    assert before - after >= HEAP_CHUNKS * CHUNK_BYTES // 2, (held, before, after)
    assert top[0] == ord("y")


class Clock:
    def __init__(self) -> None:
        self.cpu_s = 0.0

    def __call__(self) -> float:
        return self.cpu_s


def test_rest_trim_trims_once_per_rest_after_being_busy() -> None:
    clock, trims = Clock(), []
    rest = RestTrim(1.0, cpu_s=clock, trim=lambda: trims.append(clock.cpu_s) or True)
    busy_s = REST_CPU_SHARE_MAX * 1.0
    clock.cpu_s += 0.5  # busy: start-up
    assert not rest.check()
    clock.cpu_s += busy_s / 2  # at rest
    assert rest.check()
    clock.cpu_s += busy_s / 2
    assert not rest.check()  # still at rest: done already
    clock.cpu_s += busy_s  # busy again
    assert not rest.check()
    assert rest.check()  # at rest again
    assert not rest.check()
    assert rest.trims == 2
    assert trims == [0.5 + busy_s / 2, 0.5 + 2 * busy_s]


async def test_rest_trim_runs_on_the_loop_until_stopped() -> None:
    clock, trims = Clock(), []
    rest = RestTrim(0.01, cpu_s=clock, trim=lambda: trims.append(1) or True)
    rest.start()
    try:
        deadline = asyncio.get_running_loop().time() + 10.0
        while not trims:
            assert asyncio.get_running_loop().time() < deadline, "never trimmed"
            await asyncio.sleep(0.01)
    finally:
        rest.stop()
    count = rest.trims
    clock.cpu_s += 1.0  # busy: a timer still running would trim once more
    await asyncio.sleep(0.05)
    assert rest.trims == count == 1
