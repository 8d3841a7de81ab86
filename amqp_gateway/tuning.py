"""What an AMQP listener offers each connection: heartbeat, frame_max, channel_max and
the largest message, with the ranges an operator may set them to.

Owns `AmqpTuning`, its `check()` and the defaults, RabbitMQ's (a client adopts what
connection.tune offers; `Connection` enforces what was negotiated). The ranges are
RabbitMQ's and LavinMQ's: frame_max at least 4096 (the spec's frame-min-size), channel_max
1 to 65535 (a 16-bit channel number, 0 excluded as the number of the connection itself),
heartbeat 0 (off) to 65535 s (a 16-bit field), max_message_size up to 512 MiB (RabbitMQ's
ceiling). frame_max is bounded above as well, since every connection may hold a partial
frame of that size and the gateway's shared read buffer holds two. Config code
(streamq/config.py) calls `check()` to refuse a bad value with a clear message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from amqp_gateway.codec import FRAME_MIN_SIZE

# What we offer in connection.tune: RabbitMQ 3.10's defaults (rabbit.app: channel_max
# 2047, frame_max 131072, heartbeat 60 s), since a client adopts them.
CHANNEL_MAX: Final = 2047
FRAME_MAX: Final = 131072
HEARTBEAT_S: Final = 60
MESSAGE_BYTES_MAX: Final = 128 * 1024 * 1024  # RabbitMQ's max_message_size default
FRAME_MAX_LIMIT: Final = 16 * 1024 * 1024
CHANNEL_MAX_LIMIT: Final = 65535
HEARTBEAT_S_LIMIT: Final = 65535
MESSAGE_BYTES_MAX_LIMIT: Final = 512 * 1024 * 1024  # RabbitMQ's max_message_size ceiling


@dataclass(frozen=True, slots=True)
class AmqpTuning:
    """The offer of connection.tune and the largest message a connection accepts."""

    heartbeat_s: int = HEARTBEAT_S
    frame_max: int = FRAME_MAX
    channel_max: int = CHANNEL_MAX
    message_bytes_max: int = MESSAGE_BYTES_MAX  # the config's max_message_size

    def check(self) -> None:
        """Raise ValueError naming the first value out of its range."""
        _check_range("heartbeat", self.heartbeat_s, 0, HEARTBEAT_S_LIMIT)
        _check_range("frame_max", self.frame_max, FRAME_MIN_SIZE, FRAME_MAX_LIMIT)
        _check_range("channel_max", self.channel_max, 1, CHANNEL_MAX_LIMIT)
        _check_range("max_message_size", self.message_bytes_max, 1, MESSAGE_BYTES_MAX_LIMIT)


def _check_range(name: str, value: int, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, not {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be between {low} and {high}, not {value}")
