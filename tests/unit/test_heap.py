"""The broker process's collector policy (streamq/heap.py): a tick freezes what survived,
so automatic collections no longer scan it; a sweep frees cycles frozen while alive.

Method: real objects and the real collector; each test restores the interpreter's state.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from streamq.heap import SWEEP_INTERVAL_S, HeapPolicy


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def cycle() -> weakref.ref[Node]:
    """A two-object reference cycle, unreachable once this returns; a weak reference."""
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_a_tick_freezes_the_survivors_and_their_cycles_wait_for_the_sweep() -> None:
    policy = HeapPolicy(now_s=0.0)
    alive = [Node() for _ in range(1000)]
    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    policy.tick(1.0)
    assert gc.get_freeze_count() >= len(alive)
    del a, b
    gc.collect()  # an automatic collection of any generation skips frozen objects
    assert gone() is not None
    policy.tick(SWEEP_INTERVAL_S)  # the sweep: everything is collected once
    assert gone() is None
    assert policy.sweeps == 1
    assert gc.get_freeze_count() >= len(alive)  # frozen again after the sweep


def test_young_cycles_are_collected_as_usual_between_ticks() -> None:
    HeapPolicy(now_s=0.0).tick(1.0)
    gone = cycle()
    gc.collect(0)
    assert gone() is None


def test_no_sweep_before_its_interval() -> None:
    policy = HeapPolicy(now_s=100.0)
    policy.tick(100.0 + SWEEP_INTERVAL_S - 1)
    assert policy.sweeps == 0
    assert policy.next_sweep_s == 100.0 + SWEEP_INTERVAL_S
