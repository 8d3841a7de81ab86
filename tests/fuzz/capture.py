"""Record the seed corpora from real client traffic: `python -m tests.fuzz.capture`.

Starts a broker in-process on loopback (tests/integration/conftest.py's RunningBroker,
data directory in a temporary one) and a recording TCP proxy in front of each of its
ports, then runs real clients through the proxies: pika (AMQP 0-9-1: handshake, declares,
binds, publishes with properties and headers, gets, consumes, acks, nacks, rejects,
confirms, transactions, heartbeats, closes), rstream (the stream protocol: peer
properties, SASL, tune, open, create, declare publisher, publish, subscribe, credit,
store and query offset, metadata, close), websocket-client (AMQP over WebSocket on the
HTTP port) and http.client (the management API's requests). What each client sent is
written under tests/fuzz/corpus/<parser>/ with the prefix bytes its fuzz module reads
(see each module's docstring). Re-run it when a client or the protocol changes; the
files are small (a few KB) and kept in the repository.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import socket
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pika
import websocket
from rstream import AMQPMessage, Consumer, ConsumerOffsetSpecification, OffsetType, Producer

from amqp_gateway import codec
from tests.fuzz.harness import CORPUS_ROOT
from tests.integration.conftest import RunningBroker

TIMEOUT_S: Final = 10.0
READ_BYTES: Final = 65536


class RecordingProxy:
    """Forwards loopback connections to `port`; keeps what each client sent."""

    def __init__(self, port: int) -> None:
        self.target = port  # 0 until known when the broker starts after its proxy
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sent: list[bytearray] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target), TIMEOUT_S)
            record = bytearray()
            self.sent.append(record)
            threading.Thread(target=self._pipe, args=(client, server, record), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, None), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket, record: bytearray | None) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(READ_BYTES):
                if record is not None:
                    record += data
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def take(self) -> list[bytes]:
        sent = [bytes(record) for record in self.sent]
        self.sent.clear()
        return sent

    def close(self) -> None:
        self.listener.close()


def write(corpus: str, name: str, data: bytes) -> None:
    directory = CORPUS_ROOT / corpus
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_bytes(data)
    print(f"{directory / name}: {len(data)} bytes")


def pika_session(port: int) -> None:
    parameters = pika.ConnectionParameters("127.0.0.1", port, heartbeat=1)
    connection = pika.BlockingConnection(parameters)
    channel = connection.channel()
    channel.exchange_declare("fx", "topic", durable=True)
    channel.queue_declare(
        "fq", durable=True, arguments={"x-max-length": 10, "x-message-ttl": 60000}
    )
    channel.queue_bind("fq", "fx", "a.#", arguments={"k": [1, True, None], "d": {"x": "y"}})
    channel.confirm_delivery()
    properties = pika.BasicProperties(
        content_type="text/plain", delivery_mode=2, priority=3, correlation_id="c",
        reply_to="r", expiration="60000", message_id="m", timestamp=1700000000, type="t",
        user_id="guest", app_id="a", headers={"h": {"n": 1}, "l": [b"x", 15], "d": None},
    )  # fmt: skip
    for i in range(3):
        channel.basic_publish("fx", "a.b", b"body %d" % i, properties)
    channel.basic_publish("", "fq", b"x" * 5000)  # several body frames
    method, _, _ = channel.basic_get("fq")
    assert method is not None
    channel.basic_nack(method.delivery_tag, requeue=True)
    method, _, _ = channel.basic_get("fq")
    assert method is not None
    channel.basic_reject(method.delivery_tag, requeue=True)
    channel.basic_qos(prefetch_count=2)
    got: list[int] = []
    channel.basic_consume("fq", lambda ch, m, p, b: got.append(m.delivery_tag), consumer_tag="t1")
    connection.process_data_events(time_limit=0.5)
    for tag in got:
        channel.basic_ack(tag)
    channel.basic_cancel("t1")
    connection.sleep(1.5)  # a heartbeat or two
    tx = connection.channel()
    tx.tx_select()
    tx.basic_publish("", "fq", b"tx")
    tx.tx_commit()
    tx.basic_recover(requeue=True)
    tx.close()
    channel.queue_purge("fq")
    channel.queue_unbind("fq", "fx", "a.#")
    channel.queue_delete("fq")
    channel.exchange_delete("fx")
    connection.close()


async def rstream_session(port: int) -> None:
    async with Producer("127.0.0.1", port=port, username="guest", password="guest") as producer:
        await producer.create_stream("fs", exists_ok=True, arguments={"max-length-bytes": 10**6})
        for i in range(3):
            await producer.send_wait("fs", AMQPMessage(body=b"m%d" % i))
        await producer.send_batch("fs", [AMQPMessage(body=b"b%d" % i) for i in range(3)])
    received: list[bytes] = []
    async with Consumer("127.0.0.1", port=port, username="guest", password="guest") as consumer:

        async def on_message(message: AMQPMessage, context: object) -> None:
            received.append(bytes(message.body))

        await consumer.start()
        await consumer.subscribe(
            "fs",
            on_message,
            offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None),
            subscriber_name="fsub",
        )
        for _ in range(100):
            if len(received) >= 6:
                break
            await asyncio.sleep(0.05)
        await consumer.store_offset("fs", "fsub", 3)
        await consumer.query_offset("fs", "fsub")
        await consumer.stream_exists("fs")
        await consumer.delete_stream("fs")


def websocket_session(port: int) -> bytes:
    """AMQP over WebSocket: the handshake frames as binary messages. Returns the AMQP
    bytes sent (the WebSocket framing is in the proxy's record)."""
    socket_ = websocket.create_connection(
        f"ws://127.0.0.1:{port}/ws/amqp", timeout=TIMEOUT_S, subprotocols=["amqp"]
    )
    sent = b"AMQP\x00\x00\x09\x01"
    socket_.send_binary(sent)
    socket_.recv()
    start_ok = codec.encode_method_frame(
        codec.ChannelId(0), codec.methods.ConnectionStartOk({}, "PLAIN", b"\x00guest\x00guest")
    )
    socket_.send_binary(start_ok)
    socket_.recv()
    socket_.ping(b"p")
    socket_.send("text frame")
    socket_.close()
    return sent + start_ok


HTTP_REQUESTS: Final = [
    ("PUT", "/api/vhosts/fv", {}),
    ("PUT", "/api/queues/%2F/hq", {"durable": True, "arguments": {"x-max-length": 5}}),
    ("PUT", "/api/exchanges/%2F/hx", {"type": "direct", "durable": True, "arguments": {}}),
    ("POST", "/api/bindings/%2F/e/hx/q/hq", {"routing_key": "k", "arguments": {}}),
    ("PUT", "/api/users/hu", {"password": "p", "tags": "management"}),
    ("PUT", "/api/permissions/%2F/hu", {"configure": ".*", "write": ".*", "read": "^h"}),
    ("PUT", "/api/policies/%2F/hp", {"pattern": "^h", "definition": {"max-length": 9}}),
    ("PUT", "/api/parameters/shovel/%2F/hs", {"value": {"src-uri": "amqp://", "src-queue": "hq"}}),
    (
        "POST",
        "/api/exchanges/%2F/hx/publish",
        {"properties": {}, "routing_key": "k", "payload": "p", "payload_encoding": "string"},
    ),
    ("POST", "/api/queues/%2F/hq/get", {"count": 2, "ackmode": "ack_requeue_true"}),
    ("GET", "/api/queues?page=1&page_size=10&sort=name&sort_reverse=true&columns=name", None),
    ("GET", "/api/exchanges/%2F?name=h&use_regex=true&pagination=true", None),
    ("GET", "/api/definitions", None),
    ("DELETE", "/api/queues/%2F/hq?if-unused=true&if-empty=true", None),
]  # fmt: skip


def http_requests(port: int) -> list[tuple[str, str, bytes]]:
    """Send HTTP_REQUESTS with basic auth; returns (method, path, body) of each, and adds
    a definitions import of the broker's own export."""
    import http.client  # noqa: PLC0415

    token = base64.b64encode(b"guest:guest").decode()
    headers = {"Authorization": f"Basic {token}", "Content-Type": "application/json"}
    sent: list[tuple[str, str, bytes]] = []
    for method, path, body in HTTP_REQUESTS:
        payload = b"" if body is None else json.dumps(body).encode()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
        conn.request(method, path, payload or None, headers)
        response = conn.getresponse()
        data = response.read()
        conn.close()
        assert response.status < 500, (method, path, response.status, data)
        sent.append((method, path, payload))
        if path == "/api/definitions":
            sent.append(("POST", "/api/definitions", data))
    return sent


@contextlib.contextmanager
def broker(stream_proxy: RecordingProxy) -> Iterator[RunningBroker]:
    """The broker; its stream protocol advertises `stream_proxy`, so that rstream's
    connections to a stream's leader go through it too."""
    with tempfile.TemporaryDirectory(prefix="streamq-capture-") as data_dir:
        running = RunningBroker(
            Path(data_dir),
            stream_port=0,
            stream_advertised_host="127.0.0.1",
            stream_advertised_port=stream_proxy.port,
        )
        stream_proxy.target = running.stream_port
        try:
            yield running
        finally:
            running.stop()


def amqp_units(sent: bytes) -> list[bytes]:
    """A client's AMQP bytes as its protocol header and then its frames."""
    frames: list[bytes] = [sent[:8]]
    position = 8
    while position < len(sent):
        size = int.from_bytes(sent[position + 3 : position + 7])
        frames.append(sent[position : position + 8 + size])
        position += 8 + size
    return frames


def write_amqp(sent: list[bytes]) -> None:
    """Per connection and handshake state k (test_amqp_frames: `state | split | bytes`),
    the bytes after the k handshake steps the fuzz module plays itself; split 0 (one
    read) and 200 (reads of 73 bytes through the zero-copy path)."""
    for number, connection in enumerate(sent):
        units = amqp_units(connection)
        for state, skipped in enumerate([0, 1, 2, 3, 5]):
            rest = b"".join(units[skipped:])
            write("amqp", f"pika-{number}-state{state}.bin", bytes([state, 0]) + rest)
            write("amqp", f"pika-{number}-state{state}-reads.bin", bytes([state, 200]) + rest)


def stream_frames(sent: bytes) -> list[bytes]:
    """A client's stream-protocol bytes, frame by frame (each with its size)."""
    frames = []
    position = 0
    while position + 4 <= len(sent):
        size = int.from_bytes(sent[position : position + 4])
        frames.append(sent[position : position + 4 + size])
        position += 4 + size
    return frames


def write_stream(sent: list[bytes]) -> None:
    """Per connection and handshake state k (test_stream_protocol: `state | split |
    bytes`), the frames after the client's first k: its PeerProperties, SaslHandshake,
    SaslAuthenticate, Tune and Open, which the fuzz module plays itself."""
    for number, connection in enumerate(sent):
        frames = stream_frames(connection)
        for state in range(6):
            rest = b"".join(frames[state:])
            write("stream", f"rstream-{number}-state{state}.bin", bytes([state, 0]) + rest)
        write("stream", f"rstream-{number}-reads.bin", bytes([5, 61]) + b"".join(frames[5:]))


def write_http(sent: list[tuple[str, str, bytes]]) -> None:
    """Per request of test_http_api.REQUESTS (`request | mode | bytes`): its body as
    sent (mode 0), no edits (mode 1), its query string (mode 2); and the bodies and
    queries `http_requests` sent to the broker, under the template of the same route."""
    from tests.fuzz.test_http_api import REQUESTS  # noqa: PLC0415

    for index, (_method, _path, query, body) in enumerate(REQUESTS):
        raw = b"" if body is None else json.dumps(body).encode()
        write("http", f"request-{index:02}-body.bin", bytes([index, 0]) + raw)
        write("http", f"request-{index:02}-json.bin", bytes([index, 1]))
        write("http", f"request-{index:02}-query.bin", bytes([index, 2]) + query.encode())
    routes = {(method, path): index for index, (method, path, _q, _b) in enumerate(REQUESTS)}
    for number, (method, target, payload) in enumerate(sent):
        path, _, query = target.partition("?")
        found = routes.get((method, path))
        if found is not None and payload:
            write("http", f"sent-{number:02}-body.bin", bytes([found, 0]) + payload[:4096])
        elif found is not None and query:
            write("http", f"sent-{number:02}-query.bin", bytes([found, 2]) + query.encode())


def write_websocket(sent: list[bytes], amqp_bytes: bytes) -> None:
    """test_websocket's `mode | bytes`: what websocket-client wrote after its upgrade
    request (mode 0), and pika's AMQP bytes cut into binary frames of at most 255 bytes
    (mode 1: `control | length | bytes` pieces)."""
    for number, connection in enumerate(sent):
        _request, _, frames = connection.partition(b"\r\n\r\n")
        write("websocket", f"websocket-client-{number}.bin", b"\x00" + frames)
    pieces = bytearray(b"\x01")
    for position in range(0, len(amqp_bytes), 255):
        piece = amqp_bytes[position : position + 255]
        pieces += bytes([0, len(piece)]) + piece
    write("websocket", "websocket-client-amqp.bin", bytes(pieces))
    pika_bytes = (CORPUS_ROOT / "amqp" / "pika-0-state0.bin").read_bytes()[2:2000]
    pieces = bytearray(b"\x01")
    for position in range(0, len(pika_bytes), 200):
        piece = pika_bytes[position : position + 200]
        pieces += bytes([0, len(piece)]) + piece
    write("websocket", "pika-amqp.bin", bytes(pieces))


def write_tap() -> None:
    """The replication stream a leader records (streamq/log/tap.py) while a broker opens
    a fresh data directory and imports the HTTP fuzz module's definitions document (a
    vhost, a user, queues, an exchange, a binding, a policy): test_tap_actions'
    `split | bytes`, in one read and in reads of 100 bytes."""
    from streamq.broker.broker import Broker  # noqa: PLC0415
    from streamq.broker.definitions_import import Importer  # noqa: PLC0415
    from streamq.log.tap import FileTap, set_tap  # noqa: PLC0415
    from tests.fuzz.test_http_api import REQUESTS  # noqa: PLC0415

    document = next(body for _m, path, _q, body in REQUESTS if path == "/api/definitions")
    assert isinstance(document, dict)
    with tempfile.TemporaryDirectory(prefix="streamq-capture-tap-") as data_dir:
        tap = FileTap(data_dir)
        set_tap(tap)
        try:
            broker = Broker(data_dir, direct_io=False)
            asyncio.run(Importer(broker, document, None).run())
            broker.close()
        finally:
            set_tap(None)
        stream = tap.read(0, 1 << 20)
    write("tap", "broker-start-import.bin", b"\x00" + stream[:6000])
    write("tap", "broker-start-import-reads.bin", b"\x64" + stream[:6000])


def write_stream_commands() -> None:
    """Every command a client may send, which rstream's session above does not all use
    (super streams, single active consumer, stats, publisher sequence, unsubscribe...):
    one session after Open (state 5), encoded with our codec; and a few of them in each
    earlier state, where they must be refused."""
    from stream_gateway.codec import commands as c  # noqa: PLC0415
    from stream_gateway.codec import encode  # noqa: PLC0415
    from stream_gateway.codec.constants import OffsetType as StreamOffsetType  # noqa: PLC0415

    first = c.OffsetSpec(StreamOffsetType.FIRST)
    session = [
        c.ExchangeCommandVersions(1, (c.CommandVersion(1, 1, 2),)),
        c.Create(2, "fs", {"max-length-bytes": "1000000", "max-age": "1h"}),
        c.CreateSuperStream(3, "ss", ("ss-0", "ss-1"), ("0", "1"), {}),
        c.Route(4, "0", "ss"),
        c.Partitions(5, "ss"),
        c.DeclarePublisher(6, 1, "ref", "fs"),
        c.Publish(1, (c.PublishedMessage(0, b"\x00Sw\xa1\x01a"), c.PublishedMessage(1, b"b"))),
        c.Publish(1, (c.PublishedMessage(2, b"c", "filter"),), version=2),
        c.QueryPublisherSequence(7, "ref", "fs"),
        c.Subscribe(8, 1, "fs", first, 10, {"single-active-consumer": "true", "name": "n"}),
        c.ConsumerUpdateResponse(9, 1, first),
        c.Credit(1, 5),
        c.StoreOffset("n", "fs", 1),
        c.QueryOffset(10, "n", "fs"),
        c.StreamStats(11, "fs"),
        c.Metadata(12, ("fs", "missing")),
        c.Unsubscribe(13, 1),
        c.DeletePublisher(14, 1),
        c.DeleteSuperStream(15, "ss"),
        c.Delete(16, "fs"),
        c.Heartbeat(),
        c.Close(17, 0, "bye"),
    ]
    body = b"".join(encode(command) for command in session)
    write("stream", "commands-state5.bin", b"\x05\x00" + body)
    for state in range(5):
        write("stream", f"commands-state{state}.bin", bytes([state, 0]) + body[:400])


def main() -> None:
    which = set(sys.argv[1:]) or {"amqp", "stream", "websocket", "http", "tap"}
    if "tap" in which:
        write_tap()
    stream = RecordingProxy(0)
    with broker(stream) as running:
        if "amqp" in which:
            amqp = RecordingProxy(running.amqp_port)
            pika_session(amqp.port)
            write_amqp(amqp.take())
        if "stream" in which:
            write_stream_commands()
            asyncio.run(rstream_session(stream.port))
            write_stream(stream.take())
        if "websocket" in which:
            web = RecordingProxy(running.http_port)
            amqp_bytes = websocket_session(web.port)
            write_websocket(web.take(), amqp_bytes)
        if "http" in which:
            write_http(http_requests(running.http_port))


if __name__ == "__main__":
    main()
