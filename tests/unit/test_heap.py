"""The broker process's collector setting (streamq/heap.py): young collections far less
often, the older generations' rules and cycle collection as CPython's.

Method: the real collector; each test restores the interpreter's thresholds.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from streamq.heap import YOUNG_THRESHOLD, tune_collector


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
