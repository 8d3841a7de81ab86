"""The `x-stream-offset` consumer argument: every form RabbitMQ and LavinMQ accept.

Owns the translation of the AMQP value into a `StreamStart` for the broker core:
`first`, `last`, `next`, a non-negative integer offset, a negative integer (the last N
messages), an AMQP timestamp (seconds), and an interval in the `x-max-age` syntax (`30s`,
`10m`, `1h`, `7D`) meaning "from now minus that". Anything else is 406 with a clear text.
Pure: the current time is passed in.
"""

from __future__ import annotations

from typing import Final

from amqp_gateway import codec, errors
from streamq.durations import age_ms
from streamq.queues import filter_values
from streamq.queues.stream import NEXT, StreamStart

_CONSUME: Final = (60, 20)


def parse_stream_offset(value: object, now_ms: int) -> StreamStart:
    """The start for a consumer's `x-stream-offset` (None: absent, RabbitMQ's `next`).

    Raises PreconditionFailed (406) for a value that is none of the accepted forms.
    """
    if value is None:
        return NEXT
    if isinstance(value, codec.Timestamp):
        return StreamStart("time", int(value) * 1000)
    if isinstance(value, int) and not isinstance(value, bool):
        return StreamStart("offset", value) if value >= 0 else StreamStart("tail", -value)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        if value in ("first", "last", "next"):
            return StreamStart(value)
        interval_ms = age_ms(value)
        if interval_ms is not None:
            return StreamStart("time", now_ms - interval_ms)
    raise errors.PreconditionFailed(
        f"invalid x-stream-offset {value!r}: expected first, last, next, an offset, a "
        "negative count, a timestamp or an interval such as 30s, 10m, 1h, 7D",
        *_CONSUME,
    )


class StreamFilter:
    """`x-stream-filter` (a string or a list of them) against the publisher's
    `x-stream-filter-value` header: match any of them (RabbitMQ), or all of them with
    `x-filter-match-type: all` (LavinMQ), the header then holding comma-separated
    values; `x-stream-match-unfiltered` also delivers messages without the header.
    Exact and server-side. A stream client's record (streamq.log.amqp10) has its
    filter value in the record's routing key field: `streams.py` hands `accepts` the
    properties `amqp10.filter_properties` makes of it."""

    __slots__ = ("match_all", "unfiltered", "values")

    def __init__(self, values: frozenset[str], match_all: bool, unfiltered: bool) -> None:
        self.values = values
        self.match_all = match_all
        self.unfiltered = unfiltered

    def accepts(self, properties_raw: bytes) -> bool:
        if b"x-stream-filter-value" not in properties_raw:
            return self.unfiltered  # a fast path: most properties are small
        headers = codec.decode_properties(properties_raw).headers or {}
        value = headers.get("x-stream-filter-value")
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        if not isinstance(value, str):
            return self.unfiltered
        given = {part.strip() for part in value.split(",")}
        if self.match_all:
            return self.values <= given
        return not self.values.isdisjoint(given)


def parse_stream_filter(arguments: codec.FieldTable) -> StreamFilter | None:
    """The consumer's filter, None without `x-stream-filter`. Raises 406 for bad values."""
    raw = arguments.get("x-stream-filter")
    if raw is None:
        return None
    items = raw if isinstance(raw, list) else [raw]
    values = []
    for item in items:
        text = item.decode("utf-8", "replace") if isinstance(item, bytes) else item
        if not isinstance(text, str) or not text:
            raise errors.PreconditionFailed(
                f"invalid x-stream-filter {raw!r}: expected a string or a list of strings",
                *_CONSUME,
            )
        values.append(text)
    match_type = arguments.get("x-filter-match-type", "any")
    if match_type not in ("any", "all"):
        raise errors.PreconditionFailed(
            f"invalid x-filter-match-type {match_type!r}: expected any or all", *_CONSUME
        )
    unfiltered = arguments.get("x-stream-match-unfiltered", False)
    if not isinstance(unfiltered, bool):
        raise errors.PreconditionFailed(
            f"invalid x-stream-match-unfiltered {unfiltered!r}: expected a boolean", *_CONSUME
        )
    if match_type == "any":
        # A stream client's record holds a value over 255 bytes in its stored form
        # (streamq.queues.filter_values); a 0-9-1 message's header holds it as it is.
        values += [
            form.decode() for value in values for form in filter_values.forms(value.encode())
        ]
    return StreamFilter(frozenset(values), match_type == "all", unfiltered)
