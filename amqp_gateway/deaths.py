"""The gateway's `PropertiesCodec` for TTL and dead-lettering: AMQP properties in and out.

Owns the wire side of what `streamq.broker.deadletter` decides: reading a message's
`expiration` and writing the `x-death` header exactly as RabbitMQ writes it: a list of
tables, newest first, one per queue and reason, each with `count`, `reason`, `queue`,
`time`, `exchange` and `routing-keys`, a repeated death moving its entry to the front
with its count raised; `x-first-death-reason`, `-queue` and `-exchange` set once.
"""

from __future__ import annotations

import dataclasses

from amqp_gateway import codec
from amqp_gateway.errors import AMQPError
from streamq.broker.deadletter import Death


class AmqpPropertiesCodec:
    def expiration_ms(self, properties_raw: bytes) -> int | None:
        try:
            expiration = codec.decode_properties(properties_raw).expiration
        except AMQPError:
            return None
        if expiration is None or not expiration.isdigit():
            return None  # RabbitMQ refuses such publishes; here they never expire
        return int(expiration)

    def deaths(self, properties_raw: bytes) -> list[tuple[str, str]]:
        headers = codec.decode_properties(properties_raw).headers or {}
        entries = headers.get("x-death")
        if not isinstance(entries, list):
            return []
        return [
            (str(entry.get("queue", "")), str(entry.get("reason", "")))
            for entry in entries
            if isinstance(entry, dict)
        ]

    def with_death(self, properties_raw: bytes, death: Death) -> bytes:
        properties = codec.decode_properties(properties_raw)
        headers: codec.FieldTable = dict(properties.headers or {})
        previous_entries = headers.get("x-death")
        entries: list[codec.FieldValue] = [
            e
            for e in (previous_entries if isinstance(previous_entries, list) else [])
            if isinstance(e, dict)
        ]
        count = 1
        for entry in entries:
            assert isinstance(entry, dict)
            if entry.get("queue") == death.queue and entry.get("reason") == death.reason:
                previous = entry.get("count", 0)
                count = (previous if isinstance(previous, int) else 0) + 1
                entries.remove(entry)
                break
        entries.insert(
            0,
            {
                "count": codec.Int64(count),
                "reason": death.reason,
                "queue": death.queue,
                "time": codec.Timestamp(death.time_s),
                "exchange": death.exchange,
                "routing-keys": list(death.routing_keys),
            },
        )
        headers["x-death"] = entries
        headers.setdefault("x-first-death-reason", death.reason)
        headers.setdefault("x-first-death-queue", death.queue)
        headers.setdefault("x-first-death-exchange", death.exchange)
        changed = dataclasses.replace(properties, headers=headers, expiration=None)
        return codec.encode_properties(changed)
