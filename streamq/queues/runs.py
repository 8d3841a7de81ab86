"""A set of log offsets held as sorted runs of consecutive offsets.

Owns the compact form in which a classic queue holds its ready messages (and a queue
journal's replay its live ones): a queue fed by one publisher, or by a fanout, receives
consecutive offsets of its vhost's log, so a million queued messages are often one run,
two integers, where a deque of Python ints cost about 36 bytes per message and a dict of
sizes another 100. The runs live in two `array('q')`, starts and ends (exclusive), with
a head index so that taking from the front costs O(1); appending at the back is O(1);
adding or removing in the middle is a bisect and an array insert, O(runs).

It does no I/O and knows nothing of queues.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Iterator
from typing import Final

_COMPACT_HEAD_MIN: Final = 1024  # consumed runs at the front kept before the arrays shrink


class RunSet:
    """Sorted, disjoint runs [start, end) of offsets; `len` is the number of offsets."""

    __slots__ = ("_count", "_ends", "_head", "_starts")

    def __init__(self) -> None:
        self._starts = array("q")
        self._ends = array("q")
        self._head = 0  # runs before it are consumed
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    @property
    def run_count(self) -> int:
        return len(self._starts) - self._head

    def first(self) -> int | None:
        """The smallest offset, or None when empty."""
        return self._starts[self._head] if self._count else None

    def last(self) -> int | None:
        """The largest offset, or None when empty."""
        return self._ends[-1] - 1 if self._count else None

    def head_run(self) -> tuple[int, int]:
        """(first, count) of the first run; (0, 0) when empty."""
        if not self._count:
            return 0, 0
        head = self._head
        start = self._starts[head]
        return start, self._ends[head] - start

    def append_run(self, first: int, count: int) -> None:
        """Add `first` .. `first + count - 1`, all past every offset held."""
        if count <= 0:
            return
        ends = self._ends
        if self._count and ends[-1] == first:
            ends[-1] = first + count
        else:
            if self._count and first < ends[-1]:
                self._insert_run(first, count)
                return
            self._starts.append(first)
            ends.append(first + count)
        self._count += count

    def add_front(self, first: int, count: int) -> None:
        """Put back `first` .. `first + count - 1`, all below every offset held (the
        unsent part of a run just taken by `pop_run`)."""
        if count <= 0:
            return
        head = self._head
        if self._count and self._starts[head] == first + count:
            self._starts[head] = first
        elif head > 0:
            self._head = head - 1
            self._starts[head - 1] = first
            self._ends[head - 1] = first + count
        else:
            self._starts.insert(0, first)
            self._ends.insert(0, first + count)
        self._count += count

    def add(self, offset: int) -> None:
        """Add one offset anywhere (a requeue); no-op if held."""
        self._insert_run(offset, 1)

    def _insert_run(self, first: int, count: int) -> None:
        """Add a run that may fall anywhere; offsets already held are not counted twice."""
        for offset in range(first, first + count):  # rare: requeues and restores only
            self._insert_one(offset)

    def _insert_one(self, offset: int) -> None:
        starts, ends, head = self._starts, self._ends, self._head
        i = bisect_right(starts, offset, head) - 1  # run starting at or before offset
        if i >= head and offset < ends[i]:
            return  # held
        joins_left = i >= head and ends[i] == offset
        joins_right = i + 1 < len(starts) and starts[i + 1] == offset + 1
        if joins_left and joins_right:
            ends[i] = ends[i + 1]
            del starts[i + 1]
            del ends[i + 1]
        elif joins_left:
            ends[i] = offset + 1
        elif joins_right:
            starts[i + 1] = offset
        else:
            starts.insert(i + 1, offset)
            ends.insert(i + 1, offset + 1)
        self._count += 1

    def pop_run(self, count_max: int) -> tuple[int, int]:
        """Take up to `count_max` offsets from the front of the first run: (first, n);
        (0, 0) when empty."""
        if not self._count or count_max <= 0:
            return 0, 0
        head = self._head
        start = self._starts[head]
        end = self._ends[head]
        n = end - start
        if n > count_max:
            self._starts[head] = start + count_max
            self._count -= count_max
            return start, count_max
        self._count -= n
        self._head = head + 1
        self._maybe_compact()
        return start, n

    def remove_run(self, first: int, count: int) -> int:
        """Remove what is held of `first` .. `first + count - 1`; returns how many were."""
        if count <= 0:
            return 0
        end = first + count
        removed = 0
        starts, ends = self._starts, self._ends
        i = max(bisect_right(starts, first, self._head) - 1, self._head)
        while i < len(starts) and starts[i] < end:
            s, e = starts[i], ends[i]
            if e <= first:
                i += 1
                continue
            cut_start, cut_end = max(s, first), min(e, end)
            removed += cut_end - cut_start
            if cut_start == s and cut_end == e:
                del starts[i]
                del ends[i]
                continue
            if cut_start == s:
                starts[i] = cut_end
            elif cut_end == e:
                ends[i] = cut_start
            else:
                ends[i] = cut_start
                starts.insert(i + 1, cut_end)
                ends.insert(i + 1, e)
            i += 1
        self._count -= removed
        return removed

    def __contains__(self, offset: object) -> bool:
        if not isinstance(offset, int) or not self._count:
            return False
        i = bisect_right(self._starts, offset, self._head) - 1
        return i >= self._head and offset < self._ends[i]

    def clear(self) -> None:
        self._starts = array("q")
        self._ends = array("q")
        self._head = 0
        self._count = 0

    def runs(self) -> list[tuple[int, int]]:
        """Every run as (first, count), in order."""
        head = self._head
        return [(s, e - s) for s, e in zip(self._starts[head:], self._ends[head:], strict=True)]

    def __iter__(self) -> Iterator[int]:
        head = self._head
        for s, e in zip(self._starts[head:], self._ends[head:], strict=True):
            yield from range(s, e)

    def _maybe_compact(self) -> None:
        head = self._head
        if head >= _COMPACT_HEAD_MIN and head * 2 >= len(self._starts):
            del self._starts[:head]
            del self._ends[:head]
            self._head = 0
        elif head == len(self._starts):
            self.clear()
