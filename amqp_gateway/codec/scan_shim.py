"""TEMPORARY stand-in for the C scanner (amqp_gateway/codec/_scan.c)."""

from __future__ import annotations

from amqp_gateway.codec.basic import read_publish


def scan_publishes(
    data: bytes | memoryview,
    position: int,
    payload_max: int,
    body_bytes_max: int,
    count_max: int,
) -> tuple[int, int, list[tuple[bytes, bytes, str, str, int]], int, int]:
    messages: list[tuple[bytes, bytes, str, str, int]] = []
    channel = 0
    bits = flags = 0
    while len(messages) < count_max:
        message = read_publish(data, position, payload_max)
        if message is None or len(message.body) > body_bytes_max or len(message.properties_raw) < 2:
            break
        if messages and (
            message.channel != channel
            or message.exchange != messages[0][2]
            or message.routing_key != messages[0][3]
        ):
            break
        bits |= message.bits
        flags |= message.properties_raw[0]
        channel = message.channel
        messages.append(
            (
                message.properties_raw,
                message.body,
                message.exchange,
                message.routing_key,
                message.bits,
            )
        )
        position = message.end
    return channel, position, messages, bits, flags
