"""The state the throughput parent shares with its worker processes.

Owns one shared array of 64-bit counters and one lock. Each worker writes only its own
slots (no lock: one writer per slot, and the parent reads a count that is at most one
batch old). The lock guards only the two claim counters, which hand out the `-C` and
`-D` budgets batch by batch so the totals come out exact across processes. The parent
raises `go` once every worker is ready and `stop` when the run ends.
"""

from __future__ import annotations

import ctypes
import multiprocessing
from multiprocessing.context import BaseContext
from typing import Final

_STOP: Final = 0
_GO: Final = 1
_READY: Final = 2
_PUBLISH_CLAIMED: Final = 3
_CONSUME_CLAIMED: Final = 4
_HEADER_SLOTS: Final = 5
UNLIMITED: Final = 0


class Shared:
    """Counters for `publishers` publishers and `consumers` consumers."""

    def __init__(
        self,
        context: BaseContext,
        publishers: int,
        consumers: int,
        publish_max: int,
        consume_max: int,
    ) -> None:
        self.publishers = publishers
        self.consumers = consumers
        self.publish_max = publish_max
        self.consume_max = consume_max
        # Slots: header, then published and confirmed per publisher, then consumed and
        # basic.ack frames sent per consumer.
        size = _HEADER_SLOTS + 2 * publishers + 2 * consumers
        self.slots = context.RawArray(ctypes.c_int64, size)
        self.lock = context.Lock()

    def stopping(self) -> bool:
        return bool(self.slots[_STOP])

    def stop(self) -> None:
        self.slots[_STOP] = 1

    def going(self) -> bool:
        return bool(self.slots[_GO])

    def go(self) -> None:
        self.slots[_GO] = 1

    def mark_ready(self) -> None:
        with self.lock:
            self.slots[_READY] += 1

    def ready(self) -> int:
        return int(self.slots[_READY])

    def claim_publishes(self, wanted: int) -> int:
        """How many of `wanted` publishes this worker may still make (0: budget spent)."""
        return self._claim(_PUBLISH_CLAIMED, self.publish_max, wanted)

    def claim_consumes(self, wanted: int) -> int:
        """How many of `wanted` deliveries this worker may still count (0: budget spent)."""
        return self._claim(_CONSUME_CLAIMED, self.consume_max, wanted)

    def consumes_left(self) -> bool:
        return self.consume_max == UNLIMITED or self.slots[_CONSUME_CLAIMED] < self.consume_max

    def consumes_claimed(self) -> int:
        return int(self.slots[_CONSUME_CLAIMED])

    def _claim(self, slot: int, limit: int, wanted: int) -> int:
        if limit == UNLIMITED:
            return wanted
        with self.lock:
            granted = max(0, min(wanted, limit - self.slots[slot]))
            self.slots[slot] += granted
        return int(granted)

    def set_published(self, publisher: int, published: int, confirmed: int) -> None:
        base = _HEADER_SLOTS + 2 * publisher
        self.slots[base] = published
        self.slots[base + 1] = confirmed

    def set_consumed(self, consumer: int, consumed: int, ack_frames: int) -> None:
        base = _HEADER_SLOTS + 2 * self.publishers + 2 * consumer
        self.slots[base] = consumed
        self.slots[base + 1] = ack_frames

    def published(self) -> int:
        start = _HEADER_SLOTS
        return int(sum(self.slots[start : start + 2 * self.publishers : 2]))

    def confirmed(self) -> int:
        start = _HEADER_SLOTS + 1
        return int(sum(self.slots[start : start + 2 * self.publishers : 2]))

    def consumed(self) -> int:
        start = _HEADER_SLOTS + 2 * self.publishers
        return int(sum(self.slots[start : start + 2 * self.consumers : 2]))

    def ack_frames(self) -> int:
        """basic.ack frames the consumers have sent (one per message with --ack-each)."""
        start = _HEADER_SLOTS + 2 * self.publishers + 1
        return int(sum(self.slots[start : start + 2 * self.consumers : 2]))


def process_context() -> BaseContext:
    """Fork where the platform has it (the parent holds no threads), else spawn."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")
