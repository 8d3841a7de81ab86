"""A group commit's records: what a sync companion asks of a round (`CompanionWork`),
what a round must do (`Round`, gathered on the event loop) and what it did (`RoundResult`,
from the Syncer thread).

Data only: `commit` builds, runs and takes in the rounds; `state` holds the ones in flight.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final, NamedTuple

from streamq.log.segment import Segment
from streamq.log.space import CompanionBatch


class CompanionWork(NamedTuple):
    """What a sync companion asks of one round (see `SegmentLog.add_sync_companion`)."""

    fds: Sequence[int]  # to fdatasync
    actions: Sequence[Callable[[], None]] = ()  # run on the Syncer thread afterwards
    # (descriptor, bytes): written on the Syncer thread before the fdatasyncs, then that
    # descriptor is synced too. A queue journal's block written on the event loop held
    # it 45-110 us per round (and longer with more acks); the write is the thread's now.
    writes: Sequence[tuple[int, bytes]] = ()


NO_COMPANION_WORK: Final = CompanionWork(())


class Round(NamedTuple):
    """One group commit: everything appended below `next_offset`."""

    next_offset: int
    fds: list[int]
    # What earlier rounds left undone for want of room, then this round's own batch.
    companions: list[CompanionBatch]
    companions_short: bool  # a companion could not even prepare its writes (disk full)
    sealing: list[Segment]
    index_writes: list[tuple[str, bytes]]
    fsync_dir: bool


class RoundResult(NamedTuple):
    segments_done: bool  # the records below `next_offset` are durable, sealing done
    left: list[CompanionBatch]  # companion work a full disk left for the next round
