"""Places where streamq answered clients differently from RabbitMQ 3.10, each pinned by
what RabbitMQ does: confirms after a refused publish, the frame size a peer may send,
what channel_max limits, the default exchange, the order of queue.delete-ok and the
basic.cancel it causes, and topic routing of the empty routing key.

Driven by unmodified pika and py-amqp clients, or by raw frames over a socket where the
order of frames or a frame's exact size is what is tested."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator

import amqp
import kombu
import pika
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from amqp_gateway import codec
from amqp_gateway.codec import methods as m
from tests.integration.amqp_compat_calls import connect
from tests.integration.conftest import RunningBroker, drain_bodies

TIMEOUT_S = 10
FRAME_MAX = 131072


class RawClient:
    """A connection written frame by frame: what it receives is kept as (channel,
    method) in order, for tests of the exact frames and their order."""

    def __init__(self, port: int, *, channel_max: int = 2047, frame_max: int = FRAME_MAX) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)
        self.data = b""
        self.methods: list[tuple[int, m.Method]] = []
        self.sock.sendall(b"AMQP\x00\x00\x09\x01")
        self.until(received(m.ConnectionStart))
        # Asks for basic.cancel from the broker, as RabbitMQ's clients do.
        capabilities: codec.FieldTable = {"consumer_cancel_notify": True}
        start_ok = m.ConnectionStartOk(
            client_properties={"capabilities": capabilities},
            mechanism="PLAIN",
            response=b"\x00guest\x00guest",
        )
        self.send_method(0, start_ok)
        self.until(received(m.ConnectionTune))
        self.send_method(0, m.ConnectionTuneOk(channel_max, frame_max, 0))
        self.send_method(0, m.ConnectionOpen("/"))
        self.until(received(m.ConnectionOpenOk))
        self.methods.clear()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_method(self, channel: int, method: m.Method) -> None:
        self.sock.sendall(codec.encode_method_frame(codec.ChannelId(channel), method))

    def call(self, channel: int, method: m.Method, reply: type[m.Method]) -> m.Method:
        """Send `method` and wait for `reply` on the same channel."""
        self.methods.clear()
        self.send_method(channel, method)
        self.until(lambda got: any(c == channel and isinstance(x, reply) for c, x in got))
        return next(x for c, x in self.methods if c == channel and isinstance(x, reply))

    def until(self, done: Callable[[list[tuple[int, m.Method]]], bool]) -> None:
        """Read until `done(methods so far)`; fails after TIMEOUT_S or at end of stream."""
        deadline = time.monotonic() + TIMEOUT_S
        while not done(self.methods):
            assert time.monotonic() < deadline, f"timed out; received {self.methods}"
            chunk = self.sock.recv(65536)
            assert chunk, f"the broker closed the socket; received {self.methods}"
            self.data += chunk
            frames, used = codec.split_frames(self.data, FRAME_MAX)
            self.data = self.data[used:]
            self.methods += [
                (f.channel, codec.decode_method(f.payload))
                for f in frames
                if f.frame_type == codec.FrameType.METHOD
            ]

    def connection_close(self) -> m.ConnectionClose:
        self.until(received(m.ConnectionClose))
        [close] = [x for _, x in self.methods if isinstance(x, m.ConnectionClose)]
        assert isinstance(close, m.ConnectionClose)
        self.send_method(0, m.ConnectionCloseOk())
        return close

    def close(self) -> None:
        self.sock.close()


def received(kind: type[m.Method]) -> Callable[[list[tuple[int, m.Method]]], bool]:
    return lambda methods: any(isinstance(x, kind) for _, x in methods)


@pytest.fixture
def raw(broker: RunningBroker) -> Iterator[RawClient]:
    client = RawClient(broker.amqp_port)
    yield client
    client.close()


# -- 1. a refused publish does not nack the next one ---------------------------------------


def refuse_one(channel: BlockingChannel) -> None:
    """Publish to `full` (one message at most, reject-publish, declared and filled with
    `declare_full`): nacked."""
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish("", "full", b"refused")


def declare_full(channel: BlockingChannel) -> None:
    channel.queue_declare("full", arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    channel.basic_publish("", "full", b"first")


def test_a_refused_publish_leaves_the_next_unroutable_or_stream_publish_acked(
    broker: RunningBroker, connection: pika.BlockingConnection
) -> None:
    """RabbitMQ nacks only the publish a full queue refused. The flag that told the
    gateway to nack once stayed set for the next publish that reached no classic queue
    (none at all, or only streams), on any channel of any connection of the vhost."""
    channel = connection.channel()
    channel.queue_declare("events", durable=True, arguments={"x-queue-type": "stream"})
    channel.confirm_delivery()
    declare_full(channel)
    refuse_one(channel)
    channel.basic_publish("", "nowhere", b"unroutable")  # acked: no NackError
    refuse_one(channel)
    channel.basic_publish("", "events", b"to a stream only")
    refuse_one(channel)
    other = connect(broker)
    try:
        other_channel = other.channel()
        other_channel.confirm_delivery()
        other_channel.basic_publish("", "nowhere", b"from another connection")
        refuse_one(channel)
        other_channel.basic_publish("", "events", b"to a stream from another connection")
    finally:
        other.close()
    refuse_one(channel)
    # Returned, then acked (pika raises NackError for a nack, returned or not).
    with pytest.raises(pika.exceptions.UnroutableError):
        channel.basic_publish("", "nowhere", b"returned", mandatory=True)
    refuse_one(channel)
    # A delayed message is held, stored in no queue yet: acked as well.
    channel.exchange_declare("later", "x-delayed-message", arguments={"x-delayed-type": "direct"})
    channel.basic_publish("later", "k", b"held", pika.BasicProperties(headers={"x-delay": 60000}))
    refuse_one(channel)  # and the queue still refuses


# -- 2. a received frame may carry frame_max payload bytes -----------------------------------


def publish_frames(queue: str, body: bytes, frame_max: int) -> bytes:
    """basic.publish to `queue` on channel 1, its body split for `frame_max`."""
    out = bytearray()
    method = m.BasicPublish(exchange="", routing_key=queue)
    codec.append_content_frames(
        out, codec.ChannelId(1), method, codec.EMPTY_PROPERTIES_RAW, body, frame_max
    )
    return bytes(out)


@pytest.mark.parametrize("frame_max", [4096, FRAME_MAX])
def test_a_body_frame_of_frame_max_payload_bytes_is_accepted(
    broker: RunningBroker, frame_max: int
) -> None:
    """RabbitMQ 3.10 accepts a received payload of frame_max bytes (the spec's
    frame_max - 8 plus the 8 bytes of rabbit_reader's FRAME_SIZE_FUDGE) and refuses one
    byte more with FRAME_ERROR. The publish goes in one write (the scanner's path) and in
    single bytes (the frame-by-frame path)."""
    client = RawClient(broker.amqp_port, frame_max=frame_max)
    try:
        client.call(1, m.ChannelOpen(), m.ChannelOpenOk)
        client.call(1, m.QueueDeclare(queue="big"), m.QueueDeclareOk)
        body = b"b" * frame_max
        data = publish_frames("big", body, frame_max + 8)  # one body frame of frame_max
        client.send(data)
        for i in range(len(data)):
            client.send(data[i : i + 1])
        declared = client.call(1, m.QueueDeclare(queue="big", passive=True), m.QueueDeclareOk)
        assert isinstance(declared, m.QueueDeclareOk) and declared.message_count == 2
        got = client.call(1, m.BasicGet(queue="big", no_ack=True), m.BasicGetOk)
        assert isinstance(got, m.BasicGetOk)
        client.send(publish_frames("big", b"b" * (frame_max + 1), frame_max + 9))
        close = client.connection_close()
        assert close.reply_code == 501
        assert str(frame_max + 1) in close.reply_text  # the payload's size
    finally:
        client.close()


# -- 3. channel_max limits the number of open channels, not their numbers --------------------


def test_channel_max_counts_open_channels_and_any_number_opens(broker: RunningBroker) -> None:
    """RabbitMQ 3.10 opens channel 65535 under channel_max 10 and refuses the eleventh
    open channel with connection.close 530 (rabbit_reader:create_channel); a channel
    closed in between makes room again."""
    client = RawClient(broker.amqp_port, channel_max=10)
    try:
        for channel in (65535, *range(1, 10)):
            client.call(channel, m.ChannelOpen(), m.ChannelOpenOk)
        client.call(5, m.ChannelClose(200, "", 0, 0), m.ChannelCloseOk)
        client.call(40000, m.ChannelOpen(), m.ChannelOpenOk)
        client.methods.clear()
        client.send_method(11, m.ChannelOpen())
        close = client.connection_close()
        assert (close.reply_code, close.class_id, close.method_id) == (530, 0, 0)
        assert close.reply_text == (
            "NOT_ALLOWED - number of channels opened (10) has reached the negotiated "
            "channel_max (10)"
        )
    finally:
        client.close()


def test_pika_may_open_a_channel_numbered_above_channel_max(broker: RunningBroker) -> None:
    connection = connect(broker, channel_max=10)
    try:
        channel = connection.channel(channel_number=65535)
        channel.queue_declare("high")
        channel.basic_publish("", "high", b"x")
        assert channel.queue_declare("high", passive=True).method.message_count == 1
        others = [connection.channel() for _ in range(9)]
        assert [c.channel_number for c in others] == list(range(1, 10))
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            connection.channel(channel_number=20)
        assert closed.value.reply_code == 530
        assert "number of channels opened (10) has reached" in closed.value.reply_text
    finally:
        if connection.is_open:
            connection.close()


# -- 4. the default exchange cannot be declared, not even passively --------------------------


@pytest.mark.parametrize("passive", [True, False])
def test_declaring_the_default_exchange_is_403(
    connection: pika.BlockingConnection, passive: bool
) -> None:
    """RabbitMQ 3.10 refuses exchange.declare of "" before anything else, passive or not
    (rabbit_channel:check_not_default_exchange), with channel.close 403."""
    channel = connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        channel.exchange_declare("", "direct", passive=passive)
    assert closed.value.reply_code == 403
    assert closed.value.reply_text == (
        "ACCESS_REFUSED - operation not permitted on the default exchange"
    )
    assert connection.is_open
    assert connection.channel().exchange_declare("amq.direct", passive=True)


def test_declaring_the_default_exchange_names_exchange_declare(raw: RawClient) -> None:
    raw.call(1, m.ChannelOpen(), m.ChannelOpenOk)
    close = raw.call(1, m.ExchangeDeclare(exchange="", passive=True), m.ChannelClose)
    assert isinstance(close, m.ChannelClose)
    assert (close.reply_code, close.class_id, close.method_id) == (403, 40, 10)


# -- 5. queue.delete-ok comes before the basic.cancel it causes ------------------------------


def consume(client: RawClient, channel: int, queue: str, tag: str) -> None:
    client.call(channel, m.BasicConsume(queue=queue, consumer_tag=tag), m.BasicConsumeOk)


@pytest.mark.parametrize("durable", [False, True])
def test_queue_delete_ok_comes_before_the_basic_cancel_of_its_consumers(
    broker: RunningBroker, durable: bool
) -> None:
    """RabbitMQ 3.10 answers queue.delete-ok, then each consumer's channel hears that
    the queue is gone and sends basic.cancel: on the deleting connection every cancel
    follows the delete-ok, whichever channel consumed; another connection's consumer
    gets its cancel too. A durable queue's delete-ok waits for a sync round (the
    deferred path), a transient one's goes at once."""
    deleting = RawClient(broker.amqp_port)
    other = RawClient(broker.amqp_port)
    try:
        for channel in (1, 2):
            deleting.call(channel, m.ChannelOpen(), m.ChannelOpenOk)
        other.call(1, m.ChannelOpen(), m.ChannelOpenOk)
        deleting.call(1, m.QueueDeclare(queue="dq", durable=durable), m.QueueDeclareOk)
        consume(deleting, 1, "dq", "own")
        consume(deleting, 2, "dq", "sibling")
        consume(other, 1, "dq", "elsewhere")
        deleting.methods.clear()
        other.methods.clear()
        deleting.send_method(1, m.QueueDelete(queue="dq"))
        deleting.until(lambda got: sum(isinstance(x, m.BasicCancel) for _, x in got) == 2)
        assert deleting.methods[0] == (1, m.QueueDeleteOk(message_count=0))
        assert sorted((c, x) for c, x in deleting.methods[1:]) == [
            (1, m.BasicCancel(consumer_tag="own", nowait=True)),
            (2, m.BasicCancel(consumer_tag="sibling", nowait=True)),
        ]
        other.until(received(m.BasicCancel))
        assert other.methods == [(1, m.BasicCancel(consumer_tag="elsewhere", nowait=True))]
        # The consumers are gone: a new consume with the same tag is no duplicate.
        deleting.call(1, m.QueueDeclare(queue="dq"), m.QueueDeclareOk)
        consume(deleting, 1, "dq", "own")
    finally:
        deleting.close()
        other.close()


def test_deleting_an_exclusive_queue_its_channel_consumes_answers_first(raw: RawClient) -> None:
    raw.call(1, m.ChannelOpen(), m.ChannelOpenOk)
    declared = raw.call(1, m.QueueDeclare(queue="", exclusive=True), m.QueueDeclareOk)
    assert isinstance(declared, m.QueueDeclareOk)
    consume(raw, 1, declared.queue, "mine")
    raw.methods.clear()
    raw.send_method(1, m.QueueDelete(queue=declared.queue))
    raw.until(received(m.BasicCancel))
    assert raw.methods == [
        (1, m.QueueDeleteOk(message_count=0)),
        (1, m.BasicCancel(consumer_tag="mine", nowait=True)),
    ]


@pytest.mark.parametrize("durable", [False, True])
def test_py_amqp_queue_delete_of_a_consumed_queue_returns(
    broker: RunningBroker, durable: bool
) -> None:
    """py-amqp (kombu's transport) raises ConsumerCancelled from the call that waits when
    a basic.cancel comes first; RabbitMQ's order lets queue_delete return."""
    connection = amqp.Connection(f"127.0.0.1:{broker.amqp_port}", connect_timeout=TIMEOUT_S)
    connection.connect()
    try:
        channel = connection.channel()
        sibling = connection.channel()
        channel.queue_declare("kq", durable=durable, auto_delete=False)
        channel.basic_consume("kq", callback=lambda message: None)
        sibling.basic_consume("kq", callback=lambda message: None)
        assert channel.queue_delete("kq") == 0
        # The cancels follow; py-amqp reports each as ConsumerCancelled.
        with pytest.raises(amqp.exceptions.ConsumerCancelled):
            connection.drain_events(timeout=TIMEOUT_S)
    finally:
        connection.collect()


def test_kombu_queue_delete_of_a_consumed_queue_returns(broker: RunningBroker) -> None:
    with kombu.Connection(f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}//") as connection:
        channel = connection.channel()
        queue = kombu.Queue("kombu-q", channel=channel, durable=True)
        queue.declare()
        consumer = kombu.Consumer(channel, [queue], callbacks=[lambda body, message: None])
        consumer.consume()
        assert queue.delete() == 0


# -- 6. topic routing: the empty routing key is zero words -----------------------------------


def test_the_empty_routing_key_reaches_hash_and_empty_bindings_not_star(
    connection: pika.BlockingConnection,
) -> None:
    """RabbitMQ 3.10 splits "" into no words (rabbit_exchange_type_topic:split_topic_key),
    so `*` has no word to match; "a." is two words, the second empty, which `*` matches."""
    channel = connection.channel()
    channel.exchange_declare("words", "topic")
    for queue, binding in [
        ("star", "*"),
        ("hash", "#"),
        ("empty", ""),
        ("star-hash", "*.#"),
        ("a-star", "a.*"),
    ]:
        channel.queue_declare(queue)
        channel.queue_bind(queue, "words", binding)
    channel.confirm_delivery()
    channel.basic_publish("words", "", b"no words")
    channel.basic_publish("words", "a.", b"a and an empty word")
    got = {q: drain_bodies(channel, q) for q in ("star", "hash", "empty", "star-hash", "a-star")}
    assert got == {
        "star": [],
        "hash": [b"no words", b"a and an empty word"],
        "empty": [b"no words"],
        "star-hash": [b"a and an empty word"],
        "a-star": [b"a and an empty word"],
    }
