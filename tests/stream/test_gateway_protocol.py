"""The stream gateway under raw sockets: the handshake's codes, refused input, credit.

Each test speaks the protocol byte for byte with the codec (stream_gateway/codec) over a
loopback socket to an in-process broker, so that what a client library would hide or
never send (a wrong frame, an oversized size header, a command before the handshake, a
consumer that never reads) is driven exactly, and the broker's answer is read as bytes.
"""

from __future__ import annotations

import socket
import struct
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from stream_gateway.codec import commands as c
from stream_gateway.codec import decode, encode, split_frames
from stream_gateway.codec.constants import Key, OffsetType, ResponseCode
from stream_gateway.session import CLOSE_TIMEOUT_S
from streamq.broker.resources import ResourceLimits
from tests.integration.conftest import RunningBroker

TIMEOUT_S = 5.0
OK = ResponseCode.OK
FRAME_MAX = 1 << 20


class RawClient:
    """A blocking stream-protocol client that sends and reads single commands."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)
        self.buffer = bytearray()
        self.correlation_id = 0
        self.last_open: dict[str, str] = {}  # the OpenResponse's properties

    def next_id(self) -> int:
        self.correlation_id += 1
        return self.correlation_id

    def send(self, command: c.Command) -> None:
        self.sock.sendall(encode(command))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read(self) -> c.Command:
        """The next command from the broker (raises on EOF or after TIMEOUT_S)."""
        while True:
            frames, _used = split_frames(self.buffer, 1 << 26)
            if frames:
                first = frames[0]
                del self.buffer[: 4 + len(first)]
                return decode(first)
            data = self.sock.recv(1 << 16)
            if not data:
                raise EOFError("the broker closed the connection")
            self.buffer += data

    def read_until(self, kind: type[c.Command]) -> c.Command:
        while True:
            command = self.read()
            if isinstance(command, kind):
                return command

    def closed(self) -> bool:
        """Whether the broker closes the socket (read to EOF within TIMEOUT_S)."""
        try:
            while self.sock.recv(1 << 16):
                pass
        except OSError:
            return False
        return True

    def login(self, user: str = "guest", password: str = "guest", vhost: str = "/") -> None:
        self.send(c.PeerProperties(self.next_id(), {"product": "raw"}))
        assert isinstance(self.read(), c.PeerPropertiesResponse)
        self.send(c.SaslHandshake(self.next_id()))
        assert isinstance(self.read(), c.SaslHandshakeResponse)
        plain = b"\x00" + user.encode() + b"\x00" + password.encode()
        self.send(c.SaslAuthenticate(self.next_id(), "PLAIN", plain))
        answer = self.read()
        assert isinstance(answer, c.SaslAuthenticateResponse) and answer.response_code == OK
        tune = self.read()
        assert isinstance(tune, c.Tune)
        self.send(c.Tune(FRAME_MAX, 0))
        self.send(c.Open(self.next_id(), vhost))
        opened = self.read()
        assert isinstance(opened, c.OpenResponse) and opened.response_code == OK, opened
        self.last_open = opened.properties

    def request(self, command: c.Command) -> c.Command:
        self.send(command)
        return self.read()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[RunningBroker]:
    running = RunningBroker(tmp_path / "data", stream_port=0)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def client(broker: RunningBroker) -> Iterator[RawClient]:
    raw = RawClient(broker.stream_port)
    try:
        yield raw
    finally:
        raw.close()


def test_the_handshake_offers_plain_and_amqplain_and_open_advertises(client: RawClient) -> None:
    client.send(c.PeerProperties(1, {"product": "raw"}))
    properties = client.read()
    assert isinstance(properties, c.PeerPropertiesResponse)
    assert properties.properties["product"] == "streamq"
    client.send(c.SaslHandshake(2))
    mechanisms = client.read()
    assert isinstance(mechanisms, c.SaslHandshakeResponse)
    assert set(mechanisms.mechanisms) == {"PLAIN", "AMQPLAIN"}
    # AMQPLAIN: a field table without its length, LOGIN and PASSWORD as long strings.
    table = b"".join(
        bytes([len(k)]) + k + b"S" + struct.pack(">I", len(v)) + v
        for k, v in ((b"LOGIN", b"guest"), (b"PASSWORD", b"guest"))
    )
    client.send(c.SaslAuthenticate(3, "AMQPLAIN", table))
    assert client.read() == c.SaslAuthenticateResponse(3, OK)
    tune = client.read()
    assert tune == c.Tune(FRAME_MAX, 60)
    client.send(c.Tune(65536, 0))
    client.send(c.Open(4, "/"))
    opened = client.read()
    assert isinstance(opened, c.OpenResponse) and opened.response_code == OK
    assert opened.properties["advertised_host"] == "127.0.0.1"
    assert int(opened.properties["advertised_port"]) == client.sock.getpeername()[1]


def test_a_wrong_password_gets_authentication_failure_then_close(client: RawClient) -> None:
    client.send(c.PeerProperties(1, {}))
    client.read()
    client.send(c.SaslHandshake(2))
    client.read()
    client.send(c.SaslAuthenticate(3, "PLAIN", b"\x00guest\x00wrong"))
    assert client.read() == c.SaslAuthenticateResponse(3, ResponseCode.AUTHENTICATION_FAILURE)
    assert client.closed()


def test_an_unknown_mechanism_and_an_unknown_vhost_are_refused(broker: RunningBroker) -> None:
    first = RawClient(broker.stream_port)
    first.send(c.PeerProperties(1, {}))
    first.read()
    first.send(c.SaslAuthenticate(2, "CRAM-MD5", b"x"))
    code = ResponseCode.SASL_MECHANISM_NOT_SUPPORTED
    assert first.read() == c.SaslAuthenticateResponse(2, code)
    assert first.closed()
    second = RawClient(broker.stream_port)
    with pytest.raises(AssertionError):
        second.login(vhost="no-such-vhost")
    assert second.closed()


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        # An unknown key after the handshake.
        (struct.pack(">IHH", 4, 0x0077, 1), ResponseCode.UNKNOWN_FRAME),
        # Create whose stream name says 100 bytes and has 3.
        (struct.pack(">IHHIh", 13, Key.CREATE, 1, 9, 100) + b"abc", ResponseCode.UNKNOWN_FRAME),
        # A size header past frame_max: refused before its body is sent.
        (struct.pack(">IHH", FRAME_MAX + 10, Key.CREATE, 1), ResponseCode.FRAME_TOO_LARGE),
        # A known command in a version we do not speak.
        (struct.pack(">IHHIh", 10, Key.CREATE, 7, 9, 0), ResponseCode.UNKNOWN_FRAME),
    ],
)
def test_bad_frames_close_the_connection_with_their_code(
    client: RawClient, frame: bytes, code: ResponseCode
) -> None:
    client.login()
    client.send_raw(frame)
    close = client.read()
    assert isinstance(close, c.Close) and close.closing_code == code, close
    client.send(c.Response(Key.CLOSE, close.correlation_id, OK))
    assert client.closed()


def test_a_command_before_the_handshake_closes_with_unknown_frame(client: RawClient) -> None:
    client.send(c.Create(1, "early", {}))
    close = client.read()
    assert isinstance(close, c.Close) and close.closing_code == ResponseCode.UNKNOWN_FRAME
    client.send(c.Response(Key.CLOSE, close.correlation_id, OK))
    assert client.closed()


def test_requests_are_refused_with_rabbitmqs_codes(client: RawClient) -> None:
    client.login()
    assert client.request(c.Create(10, "s", {})) == c.Response(Key.CREATE, 10, OK)
    exists = ResponseCode.STREAM_ALREADY_EXISTS
    assert client.request(c.Create(11, "s", {})) == c.Response(Key.CREATE, 11, exists)
    bad = client.request(c.Create(12, "t", {"max-length-bytes": "many"}))
    assert bad == c.Response(Key.CREATE, 12, ResponseCode.PRECONDITION_FAILED)
    missing = ResponseCode.STREAM_DOES_NOT_EXIST
    assert client.request(c.Delete(13, "nope")) == c.Response(Key.DELETE, 13, missing)
    declare = c.DeclarePublisher(14, 1, "", "nope")
    assert client.request(declare) == c.Response(Key.DECLARE_PUBLISHER, 14, missing)
    query = client.request(c.QueryOffset(15, "ref", "s"))
    assert query == c.QueryOffsetResponse(15, ResponseCode.NO_OFFSET, 0)
    client.send(c.Credit(9, 5))
    no_subscription = ResponseCode.SUBSCRIPTION_ID_DOES_NOT_EXIST
    assert client.read() == c.CreditResponse(no_subscription, 9)
    metadata = client.request(c.Metadata(16, ("s", "nope")))
    assert isinstance(metadata, c.MetadataResponse)
    assert [m.response_code for m in metadata.streams] == [OK, missing]
    assert metadata.brokers[0].port == client.sock.getpeername()[1]


def test_publishing_with_an_undeclared_publisher_gets_publish_errors(client: RawClient) -> None:
    client.login()
    client.send(c.Publish(7, (c.PublishedMessage(41, b"a"), c.PublishedMessage(42, b"b"))))
    error = client.read()
    code = ResponseCode.PUBLISHER_DOES_NOT_EXIST
    assert error == c.PublishError(7, (c.PublishingError(41, code), c.PublishingError(42, code)))


def test_publish_confirm_then_deliver_v2_after_exchange_command_versions(
    client: RawClient,
) -> None:
    client.login()
    versions = client.request(c.ExchangeCommandVersions(1, (c.CommandVersion(Key.DELIVER, 1, 2),)))
    assert isinstance(versions, c.ExchangeCommandVersionsResponse)
    # Listed from key 1 without a gap: rstream reads the entry of key k at index k - 1.
    assert [v.key for v in versions.versions] == list(range(1, len(versions.versions) + 1))
    assert versions.versions[Key.PUBLISH - 1].version_max == 2
    client.request(c.Create(2, "s", {}))
    client.request(c.DeclarePublisher(3, 0, "ref", "s"))
    batch = tuple(c.PublishedMessage(i, b"m%d" % i) for i in range(1, 6))
    client.send(c.Publish(0, batch))
    assert client.read_until(c.PublishConfirm) == c.PublishConfirm(0, (1, 2, 3, 4, 5))
    client.send(c.Publish(0, batch[:2]))  # duplicates: confirmed, not stored again
    assert client.read_until(c.PublishConfirm) == c.PublishConfirm(0, (1, 2))
    sequence = client.request(c.QueryPublisherSequence(4, "ref", "s"))
    assert sequence == c.QueryPublisherSequenceResponse(4, OK, 5)
    spec = c.OffsetSpec(OffsetType.FIRST)
    assert client.request(c.Subscribe(5, 1, "s", spec, 1)) == c.Response(Key.SUBSCRIBE, 5, OK)
    deliver = client.read_until(c.Deliver)
    assert isinstance(deliver, c.Deliver) and deliver.version == 2
    assert deliver.committed_offset == 4
    # The osiris chunk header: num_entries at byte 2, the first offset at byte 24.
    entries, first_offset = struct.unpack_from(">H", deliver.chunk, 2)[0], deliver.chunk[24:32]
    assert (entries, int.from_bytes(first_offset)) == (5, 0)


def test_a_consumer_without_credit_gets_nothing_until_it_grants_one(
    broker: RunningBroker, client: RawClient
) -> None:
    client.login()
    client.request(c.Create(1, "s", {}))
    client.request(c.DeclarePublisher(2, 0, "", "s"))
    for batch in range(3):
        client.send(c.Publish(0, tuple(c.PublishedMessage(i, b"x") for i in range(100))))
        client.read_until(c.PublishConfirm)
        del batch
    spec = c.OffsetSpec(OffsetType.FIRST)
    assert client.request(c.Subscribe(3, 1, "s", spec, 0)) == c.Response(Key.SUBSCRIBE, 3, OK)
    client.sock.settimeout(0.3)
    with pytest.raises(TimeoutError):
        client.read()
    client.sock.settimeout(TIMEOUT_S)
    client.send(c.Credit(1, 1))
    deliver = client.read()
    assert isinstance(deliver, c.Deliver) and deliver.version == 1


def test_a_consumer_that_does_not_read_holds_a_bounded_write_buffer(
    broker: RunningBroker, client: RawClient
) -> None:
    """About 24 MiB are in the stream and the consumer grants plenty of credit but never
    reads: the broker stops at its write buffer's high mark (4 MiB, plus the chunk that
    crossed it), it does not queue the stream in memory."""
    client.login()
    client.request(c.Create(1, "big", {}))
    client.request(c.DeclarePublisher(2, 0, "", "big"))
    body = b"y" * 8192
    for _ in range(48):
        client.send(c.Publish(0, tuple(c.PublishedMessage(i, body) for i in range(64))))
        client.read_until(c.PublishConfirm)
    reader = RawClient(broker.stream_port)
    reader.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    reader.login()
    reader.request(c.Subscribe(1, 1, "big", c.OffsetSpec(OffsetType.FIRST), 1000))
    time.sleep(0.5)

    def buffered() -> list[int]:
        assert broker.broker is not None
        return [
            client_._session.transport.get_write_buffer_size()  # type: ignore[attr-defined]  # StreamClient
            for client_ in broker.broker.clients.values()
            if client_.protocol == "RabbitMQ Stream"
        ]

    sizes = broker.ask(buffered)
    assert max(sizes) <= 4 * 1024 * 1024 + 2 * FRAME_MAX, sizes
    assert max(sizes) > 1024 * 1024  # it did fill up to its mark
    reader.close()


def test_deleting_a_stream_sends_metadata_update_to_its_clients(broker: RunningBroker) -> None:
    owner, watcher = RawClient(broker.stream_port), RawClient(broker.stream_port)
    owner.login()
    watcher.login()
    owner.request(c.Create(1, "gone", {}))
    watcher.request(c.Subscribe(1, 3, "gone", c.OffsetSpec(OffsetType.NEXT), 1))
    watcher.request(c.DeclarePublisher(2, 4, "", "gone"))
    assert owner.request(c.Delete(2, "gone")) == c.Response(Key.DELETE, 2, OK)
    update = watcher.read()
    assert update == c.MetadataUpdate(ResponseCode.STREAM_NOT_AVAILABLE, "gone")
    unsubscribe = watcher.request(c.Unsubscribe(3, 3))  # forgotten with the stream
    assert unsubscribe == c.Response(
        Key.UNSUBSCRIBE, 3, ResponseCode.SUBSCRIPTION_ID_DOES_NOT_EXIST
    )


def test_stream_connections_are_listed_and_closed_by_the_management_api(
    broker: RunningBroker, client: RawClient
) -> None:
    client.login()
    status, listed, _ = broker.http("GET", "/api/connections")
    assert status == 200 and isinstance(listed, list)
    [found] = [item for item in listed if item["protocol"] == "RabbitMQ Stream"]
    assert found["user"] == "guest" and found["vhost"] == "/"
    name = urllib.parse.quote(found["name"], safe="")
    assert broker.http("DELETE", f"/api/connections/{name}")[0] == 204
    # No Close frame (clients expect one only as a reply): the socket ends, as in
    # RabbitMQ 3.10 (tests/stream/test_client_quirks.py has the clients).
    started = time.monotonic()
    assert client.closed()
    assert time.monotonic() - started < CLOSE_TIMEOUT_S


def test_a_stream_created_over_the_protocol_is_an_amqp_stream_queue(
    broker: RunningBroker, client: RawClient
) -> None:
    client.login()
    arguments = {"max-age": "1h", "stream-max-segment-size-bytes": "1000000"}
    assert client.request(c.Create(1, "both", arguments)) == c.Response(Key.CREATE, 1, OK)
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.amqp_port)) as amqp:
        channel = amqp.channel()
        declared = channel.queue_declare(
            "both",
            durable=True,
            arguments={
                "x-queue-type": "stream",
                "x-max-age": "1h",
                "x-stream-max-segment-size-bytes": 1000000,
            },
        )
        assert declared.method.queue == "both"


def test_the_stream_listener_is_off_with_minus_one(tmp_path: Path) -> None:
    running = RunningBroker(tmp_path / "off", stream_port=-1)
    try:
        assert not [name for name, _h, _p in running.listeners if name.startswith("stream")]
    finally:
        running.stop()


def test_a_subscription_with_credit_reads_a_long_stream_to_its_end(client: RawClient) -> None:
    """More chunks than one drain sends (CHUNKS_PER_DRAIN_MAX): the rest follow on later
    loop turns without any new event, and offsets run on without gaps."""
    client.login()
    client.request(c.Create(1, "long", {}))
    client.request(c.DeclarePublisher(2, 0, "", "long"))
    total = 140_000  # over CHUNKS_PER_DRAIN_MAX (16) chunks of 8192 records
    for start in range(0, total, 5000):
        batch = tuple(c.PublishedMessage(i, b"z") for i in range(start, start + 5000))
        client.send(c.Publish(0, batch))
    confirmed = 0
    while confirmed < total:
        confirm = client.read_until(c.PublishConfirm)
        assert isinstance(confirm, c.PublishConfirm)
        confirmed += len(confirm.publishing_ids)
    client.request(c.Subscribe(3, 1, "long", c.OffsetSpec(OffsetType.FIRST), 1000))
    expected = 0
    while expected < total:
        deliver = client.read_until(c.Deliver)
        assert isinstance(deliver, c.Deliver)
        entries, first = struct.unpack_from(">H", deliver.chunk, 2)[0], deliver.chunk[24:32]
        assert int.from_bytes(first) == expected
        expected += entries
    assert expected == total


def test_heartbeats_flow_at_the_negotiated_period(client: RawClient) -> None:
    client.send(c.PeerProperties(1, {}))
    client.read()
    client.send(c.SaslAuthenticate(2, "PLAIN", b"\x00guest\x00guest"))
    client.read()
    client.read()  # Tune
    client.send(c.Tune(FRAME_MAX, 1))  # one second: the lower value applies
    client.send(c.Open(3, "/"))
    client.read()
    started = time.monotonic()
    assert client.read() == c.Heartbeat()
    assert time.monotonic() - started < 2.5


def test_a_resource_alarm_blocks_publishers_and_not_consumers(
    broker: RunningBroker, client: RawClient
) -> None:
    """While memory is over its watermark a connection with a publisher is not read (its
    Publish waits in the socket); one that only consumes goes on; the publish is taken
    once the alarm clears."""
    client.login()
    client.request(c.Create(1, "alarmed", {}))
    client.request(c.DeclarePublisher(2, 0, "", "alarmed"))
    client.send(c.Publish(0, (c.PublishedMessage(1, b"before"),)))
    client.read_until(c.PublishConfirm)
    reader = RawClient(broker.stream_port)
    reader.login()

    def set_limits(memory_bytes: int) -> None:
        assert broker.broker is not None
        broker.broker.resources.limits = ResourceLimits(memory_bytes, 0)

    broker.call(lambda: set_limits(0))
    time.sleep(0.5)  # a check or two of the alarm
    client.send(c.Publish(0, (c.PublishedMessage(2, b"during"),)))
    spec = c.OffsetSpec(OffsetType.FIRST)
    assert reader.request(c.Subscribe(1, 1, "alarmed", spec, 5)) == c.Response(Key.SUBSCRIBE, 1, OK)
    deliver = reader.read()
    assert isinstance(deliver, c.Deliver) and deliver.chunk.endswith(b"before")
    client.sock.settimeout(0.5)
    with pytest.raises(TimeoutError):
        client.read()
    client.sock.settimeout(TIMEOUT_S)
    broker.call(lambda: set_limits(1 << 40))
    assert client.read_until(c.PublishConfirm) == c.PublishConfirm(0, (2,))
    reader.close()


def test_stream_stats_report_chunk_ids(client: RawClient) -> None:
    client.login()
    client.request(c.Create(1, "stats", {}))
    empty = client.request(c.StreamStats(2, "stats"))
    assert isinstance(empty, c.StreamStatsResponse)
    assert empty.stats == {"first_chunk_id": -1, "committed_chunk_id": -1, "last_chunk_id": -1}
    client.request(c.DeclarePublisher(3, 0, "", "stats"))
    for start in (0, 10):  # two group commits: chunks [0, 10) and [10, 20)
        client.send(
            c.Publish(0, tuple(c.PublishedMessage(i, b"s") for i in range(start, start + 10)))
        )
        client.read_until(c.PublishConfirm)
    stats = client.request(c.StreamStats(4, "stats"))
    assert isinstance(stats, c.StreamStatsResponse)
    assert stats.stats == {"first_chunk_id": 0, "committed_chunk_id": 10, "last_chunk_id": 10}


def test_a_reference_is_unique_per_connection_not_per_broker(broker: RunningBroker) -> None:
    """RabbitMQ's rule: a client that reconnects before its old connection is noticed dead
    declares its reference again on the new one."""
    old, new = RawClient(broker.stream_port), RawClient(broker.stream_port)
    old.login()
    new.login()
    old.request(c.Create(1, "refs", {}))
    assert old.request(c.DeclarePublisher(2, 0, "app", "refs")) == c.Response(
        Key.DECLARE_PUBLISHER, 2, OK
    )
    again = old.request(c.DeclarePublisher(3, 1, "app", "refs"))
    assert again == c.Response(Key.DECLARE_PUBLISHER, 3, ResponseCode.PRECONDITION_FAILED)
    assert new.request(c.DeclarePublisher(2, 0, "app", "refs")) == c.Response(
        Key.DECLARE_PUBLISHER, 2, OK
    )
    new.send(c.Publish(0, (c.PublishedMessage(7, b"after the reconnect"),)))
    assert new.read_until(c.PublishConfirm) == c.PublishConfirm(0, (7,))
    sequence = old.request(c.QueryPublisherSequence(4, "app", "refs"))
    assert sequence == c.QueryPublisherSequenceResponse(4, OK, 7)
    old.close()
    new.close()


def test_policies_apply_to_a_stream_created_over_the_protocol(
    broker: RunningBroker, client: RawClient
) -> None:
    policy = {"pattern": "^pol", "definition": {"max-age": "2h"}, "apply-to": "queues"}
    assert broker.put_policy("streams", policy) == 201
    client.login()
    assert client.request(c.Create(1, "pol-s", {})) == c.Response(Key.CREATE, 1, OK)
    status, queue, _ = broker.http("GET", "/api/queues/%2F/pol-s")
    assert status == 200 and isinstance(queue, dict)
    assert queue["type"] == "stream" and queue["policy"] == "streams"
    assert queue["effective_policy_definition"] == {"max-age": "2h"}
