"""Typed stub of the C extension `mqtt_gateway/codec/_scan.c` (see its module docstring).

A message is `(properties_raw, payload, exchange, routing_key, 0)`, the broker's run
message; a kind is QoS << 1 | DUP.
"""

from collections.abc import Callable

from typing_extensions import Buffer

def scan_publishes(
    data: Buffer,
    position: int,
    v5: bool,
    packet_bytes_max: int,
    count_max: int,
    properties: tuple[bytes, bytes, bytes, bytes],
    exchange: str,
    routing_key_of: Callable[[str], str],
    /,
) -> tuple[int, str, str, list[tuple[bytes, bytes, str, str, int]], bytes, bytes]:
    """Read consecutive whole PUBLISH packets from `data` at `position`: QoS 0 or 1, no
    RETAIN, one topic name, no MQTT 5 properties, each one `framing.Decoder` decodes.

    Returns `(end, topic, routing_key, messages, acks, kinds)`: `routing_key` is
    `routing_key_of(topic)` (called once), each message `(properties[kind], payload,
    exchange, routing_key, 0)`, `acks` the PUBACKs of the QoS 1 packets (4 bytes each),
    `kinds` one byte per packet, `end` the offset after the last one. `(position, "", "",
    [], b"", b"")` when none is accepted. Never raises for the bytes it reads.

    Raises TypeError for an argument of the wrong type, ValueError for a negative
    integer, `position > len(data)` or `count_max < 1`, and what `routing_key_of` raises.
    """
