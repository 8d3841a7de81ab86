"""A consumer's run of deliveries is written in pieces of a quarter of its prefetch
(`GatewayConsumer.deliver_records`, `channels.piece_of`), so that the client works on the
first piece while the broker frames the next.

Method: a window of log records is handed to a consumer the way
`streamq.broker.delivery.deliver_run` hands it (calling again for what is left), with an
owner that records each write; the writes are decoded and their deliveries counted.
"""

from __future__ import annotations

from typing import Any

from amqp_gateway import codec
from amqp_gateway.channels import (
    ACK_PIECE_MAX,
    PIECE_MAX,
    PIECE_MIN,
    ChannelSession,
    Clock,
    GatewayConsumer,
    piece_of,
)
from amqp_gateway.codec import methods as m
from amqp_gateway.connection import Connection
from streamq.log import format as fmt
from tests.unit.amqp_gateway.test_connection import FRAME_MAX, Client


class RecordingOwner:
    """The session's side of a channel: each write's bytes."""

    paused = False

    def __init__(self, connection: Connection) -> None:
        self.clock = Clock()
        self.unflushed = 0
        self.connection = connection
        self.writes: list[bytes] = []

    def note_output(self) -> None:
        pass

    def flush(self) -> None:
        self.unflushed = 0
        self.writes.append(self.connection.take_outgoing(0.0))


def delivery_tags(data: bytes) -> list[int]:
    frames, used = codec.split_frames(data, FRAME_MAX)
    assert used == len(data)
    methods = [codec.decode_method(f.payload) for f in frames if f.frame_type == 1]
    return [x.delivery_tag for x in methods if isinstance(x, m.BasicDeliver)]


def deliver_window(prefetch: int, count: int) -> RecordingOwner:
    """`count` records delivered to a consumer with `prefetch`, as deliver_run does."""
    client = Client()
    client.open()
    client.methods()  # the handshake's replies are not deliveries
    owner = RecordingOwner(client.server)
    channel = ChannelSession(1, client.server, owner)
    queue: Any = object()  # only kept in the unacked entries
    consumer = GatewayConsumer(channel, queue, "ctag", False, False, prefetch)
    data = b"".join(
        fmt.encode_record(i, 1_700_000_000_000, fmt.Message(b"", b"q", b"\x00\x00", b"x" * 16))
        for i in range(count)
    )
    done, position = 0, 0
    while done < count:
        delivered, position, _, _ = consumer.deliver_records(
            queue, data, position, done, count - done
        )
        assert delivered > 0
        done += delivered
    owner.flush()  # the drain's own write at its end
    return owner


def test_a_window_goes_out_in_four_writes() -> None:
    owner = deliver_window(1000, 1000)
    writes = [delivery_tags(w) for w in owner.writes if w]
    assert [len(w) for w in writes] == [250, 250, 250, 250]
    assert [tag for w in writes for tag in w] == list(range(1, 1001))


def test_what_is_left_after_the_last_full_piece_goes_with_the_drains_write() -> None:
    owner = deliver_window(1000, 600)
    assert [len(delivery_tags(w)) for w in owner.writes if w] == [250, 250, 100]


def test_a_piece_is_a_quarter_of_the_prefetch_within_bounds() -> None:
    assert piece_of(1000) == 250
    assert piece_of(10) == PIECE_MIN
    assert piece_of(1_000_000) == PIECE_MAX
    assert piece_of(0) > 1 << 20  # no prefetch: no pieces, credit is not the limit


def test_acks_are_settled_in_pieces_of_a_quarter_of_the_prefetch_at_most_512() -> None:
    client = Client()
    client.open()
    channel = ChannelSession(1, client.server, RecordingOwner(client.server))
    queue: Any = object()
    channel.consumers["a"] = GatewayConsumer(channel, queue, "a", False, False, 400)
    assert channel.ack_piece() == 100
    channel.consumers["b"] = GatewayConsumer(channel, queue, "b", False, False, 1000)
    assert channel.ack_piece() == 250  # the largest window of the channel
    channel.consumers["c"] = GatewayConsumer(channel, queue, "c", False, False, 0)
    assert channel.ack_piece() == ACK_PIECE_MAX  # no limit: drains as often as slices did
