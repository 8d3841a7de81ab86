"""A run of AMQP 0-9-1 publishes to a stream in chunks, as chunk entries: `append_converted`.

Owns turning one publish run (one exchange and routing key, many messages) into the
entries a version-2 stream stores (docs/log-format.md): each message converted to AMQP
1.0 (`amqp10.to_amqp10`, whose sections before the body are cached per property list),
its `x-stream-filter-value` header as its filter value, and a native record given in the
record form (`amqp10.native_properties`) stored as its body with its routing key as
filter value, exactly as `StreamQueue.append` stores one message. The entries are encoded
back to back and appended as one run (`SegmentLog.append_entry_run`), with no entry
object per message: the loop is C (`_streamwire.converted_entries`), which asks Python
for the sections before the body once per run of equal properties (and per message only
when the body decides the conversion).
"""

from __future__ import annotations

from array import array
from typing import Final

from streamq.log import amqp10
from streamq.log._streamwire import converted_entries
from streamq.log.log import RunMessage, SegmentLog

_SIMPLE_SIZE_MAX: Final = 0x7FFFFFFF  # a simple entry's size is 31 bits


def append_converted(
    log: SegmentLog,
    exchange: bytes,
    routing_key: bytes,
    messages: list[RunMessage],
    timestamp_ms: int,
) -> int | None:
    """Append the run's messages as converted entries; the first one's offset. None,
    appending nothing, when an entry is over the log's `record_bytes_max` (the caller's
    per-entry path then appends those before it and raises RecordTooLarge). Buffered:
    durable after the log's next sync round. Raises what `append_entry_run` raises."""
    limit = min(log.config.record_bytes_max, _SIMPLE_SIZE_MAX + 4)

    def prefix_of(properties: bytes) -> tuple[bytes | None, bytes]:
        prefix = amqp10.sections_before_body(exchange, routing_key, properties)
        return prefix, amqp10.filter_value_of(properties)

    def convert(properties: bytes, body: bytes) -> bytes:
        return amqp10.to_amqp10(exchange, routing_key, properties, body)

    made = converted_entries(messages, routing_key, prefix_of, convert, limit)
    if made is None:
        return None
    data, sizes, runs = made
    records = array("I", [1]) * len(messages)
    return log.append_entry_run(data, sizes, records.tobytes(), runs, timestamp_ms)
