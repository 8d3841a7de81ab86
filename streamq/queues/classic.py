"""A classic queue's cursor over its vhost's log: ready runs, requeues and in-flight set.

Owns which log offsets a queue holds and in what order they go out: new messages in
publish order, requeued ones first and in their original order, each with its
redelivered flag and delivery count. It holds offsets only, never message contents (the
vhost's log has them, on disk), and does no I/O.

Memory is per run and per message in flight, not per queued message:
- ready messages never delivered are a `RunSet` of offsets: a queue fed by one
  publisher holds one run of a few integers however deep it is;
- requeued messages (delivered before, back in the queue) are a sorted list with their
  delivery counts; in a classic queue they always precede the never-delivered ones,
  since delivery takes from the front;
- messages in flight are a dict offset -> body size (bounded by the consumers' prefetch);
- dead letters held for at-least-once dead-lettering (neither ready nor in flight, until
  every target has them: `streamq.broker.dead_letters`) are a dict offset -> (body
  size, the journal's mark of the death);
- `bytes_ready` is a total, kept exact by the sizes that deliveries report;
- records lost to damage on disk (bit rot, `streamq.log.damage`) are noted as offset
  spans when a read meets them, and dropped from the front as they come up: they are
  never handed out, and `damaged_messages` counts them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from itertools import repeat
from operator import sub
from typing import Final, NamedTuple, cast

from sortedcontainers import SortedList

from streamq.log.errors import RecordDamaged
from streamq.queues.journal import LiveSnapshot, QueueJournal
from streamq.queues.runs import RunSet

GIVEN_BACK_SHOWN_MAX: Final = 10  # offsets an ERROR about a wrong give-back names

logger = logging.getLogger(__name__)


class ReadyMessage(NamedTuple):
    offset: int
    redelivered: bool
    delivery_count: int  # deliveries before this one


_new = tuple.__new__


class Level:
    """Ready messages of one priority: requeued ones (sorted, with their delivery
    counts in the queue) ahead of never-delivered ones (runs)."""

    __slots__ = ("fresh", "priority", "requeued")

    def __init__(self, priority: int = 0) -> None:
        self.priority = priority
        self.fresh = RunSet()  # never delivered, in offset (= publish) order
        self.requeued = SortedList()  # delivered before and back, in offset order

    def __len__(self) -> int:
        return len(self.fresh) + len(self.requeued)

    def first(self) -> int | None:
        if self.requeued:
            return int(self.requeued[0])
        return self.fresh.first()

    def runs(self) -> list[tuple[int, int]]:
        return [(int(o), 1) for o in self.requeued] + self.fresh.runs()


class ClassicQueue:
    """The cursor state of one queue."""

    __slots__ = (
        "_counts",
        "_damage_noted",
        "_damaged",
        "_ready",
        "_redelivered_below",
        "_taken_from",
        "bytes_ready",
        "damaged_messages",
        "dead",
        "journal",
        "unacked",
    )

    def __init__(self, journal: QueueJournal | None = None) -> None:
        self.journal = journal  # durable queues record every change in it
        self._ready = Level()
        # Deliveries so far of the offsets requeued or redelivered (a first delivery in
        # flight counts 1 without an entry).
        self._counts: dict[int, int] = {}
        # After a failover every restored offset below this one counts one delivery
        # (see `restore_runs`): one integer, not an entry per message.
        self._redelivered_below = 0
        self.unacked: dict[int, int] = {}  # in flight: offset -> body size
        self.dead: dict[int, tuple[int, int]] = {}  # dead letters held: offset -> size, mark
        self._taken_from: Level = self._ready  # the level of the last take
        self.bytes_ready = 0
        # Offsets lost to damage, as (first, end, body bytes each), in offset order; the
        # messages of the queue among them are dropped when they reach the front.
        self._damaged: list[tuple[int, int, int]] = []
        self._damage_noted = False  # since `damage_noted` was last asked
        self.damaged_messages = 0  # dropped for damage

    # -- levels (a priority queue has several) -------------------------------------------

    def _level(self, priority: int) -> Level:
        return self._ready

    def _top(self) -> Level | None:
        ready = self._ready
        return ready if ready.requeued or ready.fresh else None

    def _levels(self) -> list[Level]:
        return [self._ready]

    def _requeue_level(self, offset: int) -> Level:
        return self._ready

    # -- counts --------------------------------------------------------------------------

    @property
    def message_count(self) -> int:
        """Ready messages (what queue.declare-ok reports)."""
        return len(self._ready)

    @property
    def unacked_count(self) -> int:
        return len(self.unacked)

    @property
    def bytes_unacked(self) -> int:
        return sum(self.unacked.values())

    @property
    def bytes_dead(self) -> int:
        return sum(size for size, _ in self.dead.values())

    @property
    def run_count(self) -> int:
        """Runs of never-delivered offsets (memory is per run)."""
        return sum(level.fresh.run_count for level in self._levels())

    # -- enqueue -------------------------------------------------------------------------

    def enqueue(
        self, offset: int, size_bytes: int, priority: int = 0, expiring: bool = False
    ) -> None:
        """A new message, last in line (`priority` matters to priority queues only;
        `expiring`: it carries its own expiration)."""
        self._level(priority).fresh.append_run(offset, 1)
        self.bytes_ready += size_bytes
        if self.journal is not None:
            self.journal.enqueued_run(offset, 1, size_bytes, expiring)

    def enqueue_run(
        self,
        first: int,
        count: int,
        size_bytes: int,
        priorities: list[int] | None,
        expiring: bool = False,
    ) -> None:
        """`enqueue` of the `count` messages at offsets `first`, `first + 1`, ... whose
        bodies total `size_bytes` (one run of publishes; `priorities`, one per message,
        matters to priority queues only)."""
        if priorities is None:
            self._level(0).fresh.append_run(first, count)
        else:
            for index, priority in enumerate(priorities):
                self._level(priority).fresh.append_run(first + index, 1)
        self.bytes_ready += size_bytes
        if self.journal is not None:
            self.journal.enqueued_run(first, count, size_bytes, expiring)

    def restore(self, offset: int, delivery_count: int, priority: int = 0) -> None:
        """Start-up: the journal says the queue holds `offset` (in offset order), which
        was delivered `delivery_count` times before; `bytes_ready` is set apart."""
        level = self._level(priority)
        if delivery_count:
            level.requeued.add(offset)
            self._counts[offset] = delivery_count
        else:
            level.fresh.append_run(offset, 1)

    def restore_runs(
        self, runs: list[tuple[int, int]], counts: dict[int, int], redelivered_below: int = 0
    ) -> None:
        """Start-up of a queue without priorities: it holds these runs (in offset
        order), and the offsets in `counts` were delivered that many times before.
        Every offset below `redelivered_below` counts one delivery at least (a node
        promoted to cluster leader: the former leader may have delivered any of them);
        those go out one at a time, flagged redelivered, until none is left."""
        self._redelivered_below = redelivered_below
        fresh = self._ready.fresh
        for first, count in runs:
            fresh.append_run(first, count)
        for offset, delivered in counts.items():
            if fresh.remove_run(offset, 1):
                self._ready.requeued.add(offset)
                self._counts[offset] = delivered

    # -- delivery ------------------------------------------------------------------------

    def _prior(self, offset: int) -> int:
        """Deliveries of `offset` before (not counting one in flight)."""
        count = self._counts.get(offset, 0)
        if not count and offset < self._redelivered_below:
            return 1
        return count

    def delivery_count(self, offset: int) -> int:
        """How many times the message at `offset` was delivered so far (a message in
        flight counts the delivery in progress)."""
        count = self._prior(offset)
        return count + 1 if offset in self.unacked else count

    def _fresh_redelivered(self, level: Level) -> bool:
        """The next never-delivered message is one a failover counts as delivered."""
        below = self._redelivered_below
        if not below:
            return False
        first = level.fresh.first()
        if first is not None and first < below:
            return True
        self._redelivered_below = 0  # none left: back to the fast path for good
        return False

    def peek(self) -> int | None:
        """The offset `take` would return next, without taking it (messages lost to
        damage at the front are dropped first)."""
        if self._damaged:
            self._drop_damaged_head()
        level = self._top()
        return None if level is None else level.first()

    def take_run(self, count_max: int) -> tuple[int, int]:
        """Up to `count_max` never-delivered messages at consecutive offsets, taken
        for `delivered_run`: (first, n); (0, 0) when the next message was delivered
        before (take it with `take`) or nothing is ready."""
        if self._damaged:
            self._drop_damaged_head()
        level = self._top()
        if level is None or level.requeued or self._fresh_redelivered(level):
            return 0, 0
        self._taken_from = level
        first, count = level.fresh.pop_run(count_max)
        if self._damaged and count:
            lost = self._damaged_from(first, first + count)
            if lost is not None:  # the run ends before the damage; it is dropped next
                level.fresh.add_front(lost, first + count - lost)
                count = lost - first
        return first, count

    def delivered_run(self, first: int, sizes: list[int]) -> None:
        """The messages from `first` on, taken by `take_run`, went out with these body
        sizes (a run may go out in part: `untake_run` gives back the rest)."""
        count = len(sizes)
        self.unacked.update(zip(range(first, first + count), sizes, strict=True))
        self.bytes_ready -= sum(sizes)
        if self.journal is not None:
            self.journal.delivered_run(first, count, 1)

    def untake_run(self, first: int, count: int) -> None:
        """Give back the part of a run taken by `take_run` that did not go out."""
        self._give_back(self._taken_from.fresh, first, count)

    def fresh_head_run(self) -> tuple[int, int]:
        """The first run of never-delivered messages, if they are next in line (no
        requeued message before them): (first, count); (0, 0) otherwise."""
        if self._damaged:
            self._drop_damaged_head()
        level = self._top()
        if level is None or level.requeued or self._fresh_redelivered(level):
            return 0, 0
        return level.fresh.head_run()

    def take(self) -> ReadyMessage | None:
        """The next message, taken singly; the caller then calls `delivered` (it went
        out), `dropped` (it left the queue) or `untake`. None if nothing is ready."""
        if self._damaged:
            self._drop_damaged_head()
        level = self._top()
        if level is None:
            return None
        self._taken_from = level
        if level.requeued:
            offset = int(level.requeued.pop(0))
            count = self._counts.get(offset, 0)
        else:
            offset, _ = level.fresh.pop_run(1)
            count = 1 if offset < self._redelivered_below else 0
        return _new(ReadyMessage, (offset, count > 0, count))

    def delivered(self, offset: int, size: int) -> None:
        """The message taken by `take` went out (in flight now)."""
        self.unacked[offset] = size
        self.bytes_ready -= size
        if self.journal is not None:
            self.journal.delivered_run(offset, 1, self._prior(offset) + 1)

    def untake(self, offset: int) -> None:
        """Give back the message just taken by `take`, which did not go out."""
        level = self._taken_from
        if offset not in self._counts:
            self._give_back(level.fresh, offset, 1)
        elif offset in self.unacked or offset in level.requeued:
            _given_back_wrongly(self.journal, [offset])
        else:
            level.requeued.add(offset)

    def _give_back(self, fresh: RunSet, first: int, count: int) -> None:
        """Put `first` .. `first + count - 1`, taken and not sent, back at the front of
        the never-delivered ones. Checked: one in flight (it went out) or ready already
        would go out again unflagged, so it is left out and named in an ERROR with the
        queue (a bug of the caller; an acked one goes unseen: no acked offset is kept)."""
        end, head, unacked = first + count, fresh.first(), self.unacked
        if (head is None or end <= head) and unacked.keys().isdisjoint(range(first, end)):
            fresh.add_front(first, count)
            return
        wrong = [o for o in range(first, end) if o in unacked or o in fresh]
        if wrong:
            _given_back_wrongly(self.journal, wrong)
        for offset in range(first, end):
            if offset not in unacked and offset not in fresh:
                fresh.add(offset)

    def take_expired(
        self,
        expired: Callable[[int], object],
        on_taken: Callable[[int, object], None] | None = None,
    ) -> list[int]:
        """Take the messages at the head for which `expired(offset)` is true (a record,
        say), stopping at the first for which it is not; `on_taken(offset, value)` runs
        right after each take (it settles the message, with `dropped`), so that each is
        read once and nothing read is held. Returns the offsets taken."""
        taken = []
        while (offset := self.peek()) is not None and (value := expired(offset)):
            self.take()
            taken.append(offset)
            if on_taken is not None:
                on_taken(offset, value)
        return taken

    def dropped(self, offset: int, size: int) -> None:
        """A taken message left the queue without going out (expired, dropped at the
        head): it is gone for good."""
        self.bytes_ready -= size
        self._counts.pop(offset, None)
        if self.journal is not None:
            self.journal.acked_run(offset, 1, size)

    def dropped_run(self, first: int, count: int, size: int) -> None:
        """`dropped` of the `count` messages from `first` on, taken by `take_run`, whose
        bodies total `size` bytes."""
        self.bytes_ready -= size
        if self.journal is not None:
            self.journal.acked_run(first, count, size)

    # -- damage (bit rot) ----------------------------------------------------------------

    def note_damage(self, lost: RecordDamaged, *, failed_read: bool = True) -> None:
        """A read met records lost to damage: those of the queue are dropped when they
        come to the front (a run taken now goes back first). With `failed_read` (the
        read raised for it), `damage_noted` says so once."""
        first, end = lost.first_offset, lost.end_offset
        if all(noted != first for noted, _, _ in self._damaged):
            self._damaged.append((first, end, lost.body_bytes // max(1, end - first)))
            self._damaged.sort()
        self._damage_noted = failed_read

    def damage_noted(self) -> bool:
        """Whether damage was noted since the last call: a read that failed for it is
        not the queue's failure (retry: the next take drops what was lost)."""
        noted, self._damage_noted = self._damage_noted, False
        return noted

    def _damaged_from(self, first: int, end: int) -> int | None:
        """The first offset in [first, end) lost to damage, if any."""
        for lost_first, lost_end, _ in self._damaged:
            if lost_first < end and lost_end > first:
                return max(first, lost_first)
        return None

    def _drop_damaged_head(self) -> None:
        """Drop the messages lost to damage at the front, as `dropped` does (the journal
        records them settled)."""
        while (level := self._top()) is not None:
            head = level.first()
            assert head is not None
            span = next((d for d in self._damaged if d[0] <= head < d[1]), None)
            if span is None:
                return
            if level.requeued and int(level.requeued[0]) == head:
                level.requeued.pop(0)
                self._counts.pop(head, None)
                count = 1
            else:
                _, count = level.fresh.pop_run(span[1] - head)
            size = span[2] * count
            self.bytes_ready = max(0, self.bytes_ready - size)
            self.damaged_messages += count
            if self.journal is not None:
                self.journal.acked_run(head, count, size)

    # -- dead letters held (at-least-once dead-lettering) ---------------------------------

    def hold_dead(self, offset: int, size: int | None, mark: int) -> bool:
        """The message left the queue's order as a dead letter but stays held until
        `release_dead`: in flight (`size` None) or just taken by `take` (of `size`
        bytes). `mark` is the journal's record of the death (`journal.dead_mark`).
        Returns False if it was in flight no longer."""
        if size is None:
            size = self.unacked.pop(offset, None)
            if size is None:
                return False
        else:
            self.bytes_ready -= size
        self.dead[offset] = (size, mark)
        if self.journal is not None:
            self.journal.dead_run(offset, 1, mark)
        return True

    def restore_dead(self, offset: int, size: int, mark: int) -> bool:
        """Start-up: the journal says the ready message at `offset` (of `size` bytes) is
        a dead letter held (`mark`); returns False if the queue does not hold it."""
        for level in self._levels():
            if level.fresh.remove_run(offset, 1):
                break
            if offset in level.requeued:
                level.requeued.remove(offset)
                break
        else:
            return False
        self.bytes_ready -= size
        self.dead[offset] = (size, mark)
        return True

    def release_dead(self, offset: int) -> None:
        """The dead letter held at `offset` is gone for good (every target has it, or
        the queue no longer holds dead letters)."""
        held = self.dead.pop(offset, None)
        if held is None:
            return
        self._counts.pop(offset, None)
        if self.journal is not None:
            self.journal.acked_run(offset, 1, held[0])

    # -- settlement ----------------------------------------------------------------------

    def ack(self, offset: int) -> int:
        """The message in flight is gone from the queue (acked, or rejected without
        requeue). Returns its size in bytes (0 if it was not in flight)."""
        size = self.unacked.pop(offset, None)
        if size is None:
            return 0
        self._counts.pop(offset, None)
        if self.journal is not None:
            self.journal.acked_run(offset, 1, size)
        return size

    def ack_many(self, offsets: list[int]) -> None:
        """`ack` of each of `offsets` (the acks of one read, or one with `multiple`),
        in C-level loops; the journal records them as runs."""
        popped = list(map(self.unacked.pop, offsets, repeat(None)))
        if None in popped:  # some were gone already: only the others are acked now
            pairs = [(o, s) for o, s in zip(offsets, popped, strict=True) if s is not None]
            offsets = [o for o, _ in pairs]
            sizes = [s for _, s in pairs]
        else:
            sizes = cast("list[int]", popped)
        if not offsets:
            return
        counts = self._counts
        if counts:
            for offset in offsets:
                counts.pop(offset, None)
        journal = self.journal
        if journal is not None:
            first = offsets[0]
            if len(offsets) == offsets[-1] - first + 1 and offsets == sorted(offsets):
                journal.acked_run(first, len(offsets), sum(sizes))  # in order: one run
            else:
                # One entry per stretch of consecutive offsets: a consumer among several
                # acks the runs it was given, with the other consumers' runs between.
                start = 0
                for end in _run_ends(offsets):
                    journal.acked_run(offsets[start], end - start, sum(sizes[start:end]))
                    start = end

    def requeue(self, offset: int) -> None:
        """Back to ready, ahead of new messages and in original publish order."""
        level = self._requeue_level(offset)
        size = self.unacked.pop(offset, None)
        if size is None:
            return
        self._counts[offset] = self._prior(offset) + 1
        level.requeued.add(offset)
        self.bytes_ready += size

    def purge(self) -> int:
        """Drop every ready message (in-flight ones stay); returns how many."""
        count = self.message_count
        if not count:
            return 0
        journal = self.journal
        # The bytes total matters to a restart, not how it is spread over the runs.
        bytes_left = self.bytes_ready
        for level in self._levels():
            for offset in level.requeued:
                self._counts.pop(int(offset), None)
            if journal is not None:
                for first, n in level.runs():
                    journal.acked_run(first, n, bytes_left)
                    bytes_left = 0
            level.requeued.clear()
            level.fresh.clear()
        self.bytes_ready = 0
        return count

    # -- what is held --------------------------------------------------------------------

    def ready_runs(self) -> list[tuple[int, int]]:
        """The ready messages as (first, count) runs, in delivery order."""
        runs: list[tuple[int, int]] = []
        for level in self._levels():
            runs += level.runs()
        return runs

    def held_runs(self) -> list[tuple[int, int]]:
        """Every offset still held, ready or in flight, as sorted runs."""
        held = RunSet()
        for first, count in sorted(self.ready_runs()):
            held.append_run(first, count)
        for offset in self.unacked:
            held.add(offset)
        for offset in self.dead:
            held.add(offset)
        return held.runs()

    def live_snapshot(self, expiring: bool) -> LiveSnapshot:
        """What a compacted journal must hold: every offset still held as sorted runs,
        the delivery counts of those delivered before, and the bytes held."""
        counts = dict(self._counts)
        for offset in self.unacked:
            counts[offset] = counts.get(offset, 0) + 1
        return LiveSnapshot(
            self.held_runs(),
            counts,
            self.bytes_ready + self.bytes_unacked + self.bytes_dead,
            expiring,
            {offset: mark for offset, (_, mark) in self.dead.items()},
        )

    def live_entries(self) -> int:
        """About how many journal entries `live_snapshot` takes (cheap)."""
        return self.run_count + len(self.unacked) + len(self._counts) + len(self.dead)

    def low_water_offset(self) -> int | None:
        """The smallest offset the queue still needs, or None if it needs none."""
        candidates = [first for level in self._levels() if (first := level_min(level)) is not None]
        if self.unacked:
            candidates.append(min(self.unacked))
        if self.dead:
            candidates.append(min(self.dead))
        return min(candidates) if candidates else None


def _given_back_wrongly(journal: QueueJournal | None, offsets: list[int]) -> None:
    where = journal.path if journal is not None else "(not durable)"
    shown = ", ".join(map(str, offsets[:GIVEN_BACK_SHOWN_MAX]))
    text = "queue %s: offsets %s (%d) given back while in flight or held; left out"
    logger.error(text, where, shown, len(offsets))


def level_min(level: Level) -> int | None:
    """The smallest offset of a level (requeued ones and runs are each sorted)."""
    values = []
    if level.requeued:
        values.append(int(level.requeued[0]))
    first = level.fresh.first()
    if first is not None:
        values.append(first)
    return min(values) if values else None


def _run_ends(offsets: list[int]) -> list[int]:
    """Where each stretch of consecutive offsets in `offsets` ends (an index past it),
    the last one being len(offsets)."""
    steps = map(sub, offsets[1:], offsets[:-1])  # C-level: offsets[i + 1] - offsets[i]
    ends = [index for index, step in enumerate(steps, 1) if step != 1]
    ends.append(len(offsets))
    return ends
