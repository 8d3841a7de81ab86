"""The connection class: the handshake and its failures (protocol header, login, vhost,
tuning), connection.close from the client, and methods that do not belong on channel 0.

The handshake variants that `s.connect(...)` cannot express are driven frame by frame on
a raw socket (`raw_connect`); the helpers here are shared with channel.py and frames.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from amqp_gateway import codec
from amqp_gateway.codec import methods as m
from tests.differential.harness import REPLY_TIMEOUT_S, Conn, Session, scenario
from tests.differential.wire import CLIENT_PROPERTIES, Closed, Silence, WireClient

PLAIN_GUEST = b"\x00guest\x00guest"


def raw_connect(s: Session) -> Conn:
    """A connection of the session with nothing sent yet, not even the protocol header."""
    conn = Conn(s, len(s.conns) + 1, WireClient("127.0.0.1", s.endpoint.amqp_port))
    s.conns.append(conn)
    return conn


def method_frame(channel: int, method: codec.Method) -> bytes:
    return codec.encode_method_frame(codec.ChannelId(channel), method)


def start_ok(mechanism: str = "PLAIN", response: bytes = PLAIN_GUEST) -> m.ConnectionStartOk:
    return m.ConnectionStartOk(
        client_properties=CLIENT_PROPERTIES,  # type: ignore[arg-type]
        mechanism=mechanism,
        response=response,
    )


def read_start(c: Conn) -> None:
    """Read connection.start and log only what both brokers must agree on: the version
    and the mechanisms (the server properties differ by design)."""
    try:
        observation = c.client.read(REPLY_TIMEOUT_S)
    except (Silence, Closed) as exc:
        c.session.record("no connection.start", type(exc).__name__)
        return
    fields = observation[3]
    c.session.record(
        observation[2],
        fields.get("version_major"),
        fields.get("version_minor"),
        fields.get("mechanisms"),
        fields.get("locales"),
    )


def read_tune(c: Conn) -> None:
    """Read what follows start-ok: connection.tune (logged with its fields) or a close."""
    c.expect(1, "connection.tune", "connection.open-ok")


def to_open(
    c: Conn,
    header: bytes = codec.PROTOCOL_HEADER_0_9_1,
    login: m.ConnectionStartOk | None = None,
) -> None:
    """A raw handshake up to connection.open-ok, with the tuning the server offers."""
    c.client.send_raw(header)
    read_start(c)
    c.client.send_raw(method_frame(0, login or start_ok()))
    read_tune(c)
    tune = c.session.log[-1][4]
    c.client.frame_max = tune["frame_max"]
    tune_ok = m.ConnectionTuneOk(channel_max=tune["channel_max"], frame_max=tune["frame_max"])
    c.client.send_raw(method_frame(0, tune_ok) + method_frame(0, m.ConnectionOpen()))
    c.expect(1, "connection.open-ok")


def until_close(c: Conn, *, socket: bool = True) -> None:
    """Read (and log) until the broker closes the connection, then how the socket ends.
    Not after a frame error: RabbitMQ then drops the socket 3 s after its close, whether
    the close-ok came or not (rabbit_reader:fatal_frame_error), a race with our wait."""
    c.expect(1, "connection.close")
    if socket:
        socket_end(c)


def refused_quietly(c: Conn) -> None:
    """Log whatever the broker sends within `quiet`, then give the socket up.

    Before tune-ok, RabbitMQ 3.10 answers an error (but a refused login, with the
    authentication_failure_close capability) by closing the socket without a
    connection.close, after a 3 s delay (rabbit_reader:handle_exception, SILENT_CLOSE_DELAY);
    the spec requires it for a bad mechanism and a tune-ok above the server's limits. So
    nothing may come within `quiet`; what comes after is not compared (the delay is RabbitMQ's
    defence against login floods, not behaviour a client relies on)."""
    c.quiet()
    c.client.closed = True


def socket_end(c: Conn) -> None:
    """Log whether the broker closes the socket (after a close handshake, or at once)."""
    deadline = time.monotonic() + REPLY_TIMEOUT_S
    try:
        while True:
            frame_type, channel, payload = c.client.read_frame(deadline)
            c.session.record("frame", frame_type, channel, payload)
    except Silence:
        c.session.record("socket still open")
    except Closed:
        c.session.record("socket closed")


def raw_reply(c: Conn) -> None:
    """Log every byte the broker sends until it closes the socket (or goes silent)."""
    deadline = time.monotonic() + REPLY_TIMEOUT_S
    data = bytearray()
    ended = "silence"
    while time.monotonic() < deadline:
        c.client.sock.settimeout(max(deadline - time.monotonic(), 0.01))
        try:
            chunk = c.client.sock.recv(65536)
        except TimeoutError:
            break
        except OSError:
            chunk = b""
        if not chunk:
            ended = "socket closed"
            c.client.closed = True
            break
        data += chunk
    c.session.record("raw", bytes(data), ended)


# -- the handshake ---------------------------------------------------------------------------


@scenario("connection: handshake, open-ok, client close")
def _handshake(s: Session) -> None:
    c = s.connect()
    c.close()


@scenario("connection: raw handshake with the offered tuning")
def _raw_handshake(s: Session) -> None:
    c = raw_connect(s)
    to_open(c)
    c.open(1)
    c.close()


def _wrong_header(header: bytes) -> Callable[[Session], None]:
    def run(s: Session) -> None:
        c = raw_connect(s)
        c.client.send_raw(header)
        raw_reply(c)

    return run


for _label, _header in (
    ("AMQP 0-9-2", b"AMQP\x00\x00\x09\x02"),
    ("AMQP 1.0", b"AMQP\x00\x01\x00\x00"),
    ("HTTP request", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("AMQP 1.0 SASL", b"AMQP\x03\x01\x00\x00"),
):
    scenario(f"connection: wrong protocol header ({_label})")(_wrong_header(_header))


@scenario("connection: protocol header 0-9 is spoken as 0-9-1")
def _header_0_9(s: Session) -> None:
    c = raw_connect(s)
    to_open(c, codec.PROTOCOL_HEADER_0_9)
    c.open(1)


@scenario("connection: bad password is refused with 403")
def _bad_password(s: Session) -> None:
    c = s.connect(password="wrong")
    socket_end(c)


@scenario("connection: unknown user is refused with 403")
def _unknown_user(s: Session) -> None:
    c = s.connect(user=s.name("nobody"))
    socket_end(c)


@scenario("connection: AMQPLAIN login")
def _amqplain(s: Session) -> None:
    c = raw_connect(s)
    table = codec.encode_table({"LOGIN": "guest", "PASSWORD": "guest"})
    to_open(c, login=start_ok("AMQPLAIN", table[4:]))
    c.open(1)


@scenario("connection: AMQPLAIN with a wrong password")
def _amqplain_bad(s: Session) -> None:
    c = raw_connect(s)
    c.client.send_raw(codec.PROTOCOL_HEADER_0_9_1)
    read_start(c)
    table = codec.encode_table({"LOGIN": "guest", "PASSWORD": "nope"})
    c.client.send_raw(method_frame(0, start_ok("AMQPLAIN", table[4:])))
    read_tune(c)
    socket_end(c)


@scenario("connection: unknown authentication mechanism")
def _unknown_mechanism(s: Session) -> None:
    c = raw_connect(s)
    c.client.send_raw(codec.PROTOCOL_HEADER_0_9_1)
    read_start(c)
    c.client.send_raw(method_frame(0, start_ok("CRAM-MD5", b"guest")))
    refused_quietly(c)


@scenario("connection: a refused login without authentication_failure_close")
def _refused_without_capability(s: Session) -> None:
    c = raw_connect(s)
    c.client.send_raw(codec.PROTOCOL_HEADER_0_9_1)
    read_start(c)
    login = m.ConnectionStartOk(
        client_properties={"product": "old client"}, response=b"\x00guest\x00wrong"
    )
    c.client.send_raw(method_frame(0, login))
    refused_quietly(c)


@scenario("connection: unknown vhost is refused with 530")
def _unknown_vhost(s: Session) -> None:
    c = s.connect(vhost=s.name("vhost"))
    socket_end(c)


def to_tune_ok(c: Conn, channel_max: int, frame_max: int) -> None:
    """A raw handshake that answers connection.tune with the given values (and sends
    connection.open right behind, as clients do)."""
    c.client.send_raw(codec.PROTOCOL_HEADER_0_9_1)
    read_start(c)
    c.client.send_raw(method_frame(0, start_ok()))
    c.expect(1, "connection.tune")
    tune_ok = m.ConnectionTuneOk(channel_max=channel_max, frame_max=frame_max)
    c.client.frame_max = frame_max or 4096
    c.client.send_raw(method_frame(0, tune_ok) + method_frame(0, m.ConnectionOpen()))


_REFUSED_TUNINGS: dict[str, tuple[int, int]] = {
    "channel_max above the server's": (65535, 4096),
    "channel_max 0 (no limit)": (0, 4096),
    "frame_max above the server's": (16, 131073),
    "frame_max 0 (no limit)": (16, 0),
    "frame_max below 4096": (16, 4095),
}


def _refused_tuning(channel_max: int, frame_max: int) -> Callable[[Session], None]:
    def run(s: Session) -> None:
        c = raw_connect(s)
        to_tune_ok(c, channel_max, frame_max)
        refused_quietly(c)

    return run


for _label, (_channel_max, _frame_max) in _REFUSED_TUNINGS.items():
    scenario(f"connection: tune-ok with {_label} is refused")(
        _refused_tuning(_channel_max, _frame_max)
    )


def _accepted_tuning(channel_max: int, frame_max: int) -> Callable[[Session], None]:
    def run(s: Session) -> None:
        c = raw_connect(s)
        to_tune_ok(c, channel_max, frame_max)
        c.expect(1, "connection.open-ok")
        c.open(1)
        c.call(1, m.QueueDeclare(queue=s.name(), exclusive=True))

    return run


for _label, (_channel_max, _frame_max) in {
    "frame_max exactly 4096": (16, 4096),
    "channel_max 1": (1, 8192),
}.items():
    scenario(f"connection: tune-ok with {_label}")(_accepted_tuning(_channel_max, _frame_max))


@scenario("connection: tune-ok before start-ok")
def _tune_ok_early(s: Session) -> None:
    c = raw_connect(s)
    c.client.send_raw(codec.PROTOCOL_HEADER_0_9_1)
    read_start(c)
    c.client.send_raw(method_frame(0, m.ConnectionTuneOk(channel_max=10, frame_max=4096)))
    refused_quietly(c)


@scenario("connection: channel.open before connection.open")
def _channel_before_open(s: Session) -> None:
    c = raw_connect(s)
    c.client.send_raw(codec.PROTOCOL_HEADER_0_9_1)
    read_start(c)
    c.client.send_raw(method_frame(0, start_ok()))
    read_tune(c)
    tune_ok = m.ConnectionTuneOk(channel_max=10, frame_max=4096)
    c.client.send_raw(method_frame(0, tune_ok) + method_frame(1, m.ChannelOpen()))
    until_close(c)


@scenario("connection: connection.close between tune-ok and connection.open")
def _close_before_open(s: Session) -> None:
    c = raw_connect(s)
    c.client.send_raw(codec.PROTOCOL_HEADER_0_9_1)
    read_start(c)
    c.client.send_raw(method_frame(0, start_ok()))
    c.expect(1, "connection.tune")
    tune_ok = m.ConnectionTuneOk(channel_max=16, frame_max=4096)
    close = m.ConnectionClose(reply_code=200, reply_text="changed my mind")
    c.client.send_raw(method_frame(0, tune_ok) + method_frame(0, close))
    until_close(c)


# -- an open connection ----------------------------------------------------------------------


@scenario("connection: close from the client with channels open")
def _close_with_channels(s: Session) -> None:
    c = s.channel(1)
    c.open(2)
    c.call(1, m.QueueDeclare(queue=s.name(), exclusive=True))
    c.call(0, m.ConnectionClose(reply_code=320, reply_text="going away", class_id=0, method_id=0))
    d = s.connect()
    d.open(1)
    d.call(1, m.QueueDeclare(queue=s.name(), passive=True))


@scenario("connection: frames after the client's connection.close are not answered")
def _after_client_close(s: Session) -> None:
    c = s.channel(1)
    c.client.send_raw(
        method_frame(0, m.ConnectionClose(reply_code=200, reply_text="bye"))
        + method_frame(1, m.QueueDeclare(queue=s.name()))
    )
    c.expect(1, "connection.close-ok")
    d = s.connect()
    d.open(1)
    d.call(1, m.QueueDeclare(queue=s.name(), passive=True))


_CHANNEL_0_METHODS: dict[str, codec.Method] = {
    "queue.declare": m.QueueDeclare(queue="q"),
    "channel.open": m.ChannelOpen(),
    "connection.open again": m.ConnectionOpen(virtual_host="/"),
    "connection.start-ok again": start_ok(),
    "connection.tune-ok again": m.ConnectionTuneOk(channel_max=10, frame_max=4096),
    "connection.close-ok unasked": m.ConnectionCloseOk(),
    "channel.close": m.ChannelClose(reply_code=200, reply_text="bye"),
    "basic.qos": m.BasicQos(prefetch_count=1),
}


def _on_channel_0(method: codec.Method) -> Callable[[Session], None]:
    def run(s: Session) -> None:
        c = s.connect()
        c.send(0, method)
        until_close(c)

    return run


for _label, _method in _CHANNEL_0_METHODS.items():
    scenario(f"connection: {_label} on channel 0")(_on_channel_0(_method))


@scenario("connection: basic.publish with content on channel 0")
def _publish_on_0(s: Session) -> None:
    c = s.connect()
    c.publish(0, "", s.name(), b"body")
    until_close(c)


@scenario("connection: heartbeat frame on channel 0 is accepted")
def _heartbeat_0(s: Session) -> None:
    c = s.channel(1)
    c.client.send_raw(codec.HEARTBEAT_FRAME)
    c.sync(1)
    c.close()


@scenario("connection: heartbeat frame on channel 1")
def _heartbeat_1(s: Session) -> None:
    c = s.channel(1)
    c.client.send_raw(codec.encode_frame(codec.FRAME_HEARTBEAT, codec.ChannelId(1), b""))
    until_close(c)


@scenario("connection: heartbeat frame with a payload")
def _heartbeat_payload(s: Session) -> None:
    c = s.connect()
    c.client.send_raw(codec.encode_frame(codec.FRAME_HEARTBEAT, codec.ChannelId(0), b"ab"))
    until_close(c)


@scenario("connection: content header on channel 0")
def _header_on_0(s: Session) -> None:
    c = s.connect()
    out = bytearray()
    codec.append_content_header_frame(out, codec.ChannelId(0), 1, codec.EMPTY_PROPERTIES_RAW, 4096)
    c.client.send_raw(bytes(out))
    until_close(c)


@scenario("connection: update-secret")
def _update_secret(s: Session) -> None:
    c = s.connect()
    c.call(0, m.ConnectionUpdateSecret(new_secret=b"guest", reason="rotation"))
    c.open(1)
