"""A stream queue: its own segment log, read from any offset by any number of consumers.

Owns a stream's log and the translation of a consumer's starting point (`x-stream-offset`:
first, last, next, an offset, the last N, a timestamp or an age) into an offset. Reading
consumes nothing: each consumer keeps its own position, and the broker core moves it. It
knows no AMQP; the gateway parses the argument into a `StreamStart`.
"""

from __future__ import annotations

import re
from typing import Final, NamedTuple

from streamq.log import format as fmt
from streamq.log.log import SegmentLog

# x-max-age syntax (RabbitMQ): a count and one unit, Y M D h m s.
AGE_PATTERN: Final = re.compile(r"^(\d+)([YMDhms])$")
_UNIT_MS: Final = {
    "Y": 365 * 24 * 3600 * 1000,
    "M": 30 * 24 * 3600 * 1000,
    "D": 24 * 3600 * 1000,
    "h": 3600 * 1000,
    "m": 60 * 1000,
    "s": 1000,
}
READ_RECORDS_MAX: Final = 256  # records read for one consumer per drain


def parse_age_ms(text: str) -> int | None:
    """`30s`, `10m`, `1h`, `7D`, `1M`, `1Y` in milliseconds; None if it is not one."""
    match = AGE_PATTERN.match(text)
    if match is None:
        return None
    return int(match[1]) * _UNIT_MS[match[2]]


class StreamStart(NamedTuple):
    """Where a consumer starts: kind is first, last, next, offset (value: the offset),
    tail (value: how many of the newest messages) or time (value: a time in ms)."""

    kind: str
    value: int = 0


NEXT: Final = StreamStart("next")


class StreamQueue:
    """A stream's log; the broker's event-loop thread only."""

    __slots__ = ("log",)

    def __init__(self, log: SegmentLog) -> None:
        self.log = log

    @property
    def message_count(self) -> int:
        return self.log.next_offset - self.log.start_offset

    def append(
        self, exchange: bytes, routing_key: bytes, properties: bytes, body: bytes, timestamp_ms: int
    ) -> int:
        """Buffered: readable and durable after the log's next sync round."""
        return self.log.append_one(exchange, routing_key, properties, body, timestamp_ms)

    def start_offset(self, start: StreamStart) -> int:
        """The first offset a consumer starting at `start` reads (RabbitMQ's meanings;
        `last` is the first offset of the newest segment that holds messages)."""
        log = self.log
        first, end = log.start_offset, log.durable_next
        kind = start.kind
        if kind == "first":
            return first
        if kind == "last":
            with_records = [s for s in log.segments() if s.next_offset > s.base_offset]
            return max(first, with_records[-1].base_offset) if with_records else end
        if kind == "offset":
            return min(max(start.value, first), end)
        if kind == "tail":
            return max(first, end - start.value)
        if kind == "time":
            return log.seek_timestamp(start.value) if end > first else end
        return log.next_offset  # next: only what is published from now on

    def read(self, offset: int) -> list[fmt.Record]:
        """Durable records from `offset` (raised to the stream's start if retention has
        dropped it), at most READ_RECORDS_MAX."""
        return self.log.read(max(offset, self.log.start_offset), READ_RECORDS_MAX)
