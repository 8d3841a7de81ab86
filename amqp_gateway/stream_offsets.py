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
