"""The AMQP listeners end to end: a unix socket and PROXY protocol on real sockets.

Method: the broker runs in-process with `amqp_unix_path`, `tcp_proxy_protocol` or
`unix_proxy_protocol` set. pika, which cannot dial a unix socket nor write a PROXY
header, goes through `Relay`, a loopback TCP relay written here that forwards to the
broker's TCP port or its unix socket and, like a load balancer, first sends a PROXY
header naming an address of our choosing; the management API must then show that
address. Raw sockets do the rest: a handshake straight on the unix socket, a header cut
into single bytes with the AMQP protocol header in the same segment as its end, no
header, and a header that stalls.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import shutil
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest

from amqp_gateway import codec, listeners
from amqp_gateway.codec import methods as m
from streamq.app import ServeError
from streamq.proxy_protocol import V2_SIGNATURE
from tests.integration.conftest import RunningBroker
from tests.integration.test_publish_runs import FRAME_MAX, TIMEOUT_S, Reader, received

Header = Callable[[socket.socket], bytes]  # the relay's PROXY header for a client socket
AMQP_HEADER = b"AMQP\x00\x00\x09\x01"


class Relay:
    """A loopback TCP listener that relays each connection to `dial()`, sending
    `header(client)` first when given: a load balancer in front of the broker."""

    def __init__(self, dial: Callable[[], socket.socket], header: Header | None = None) -> None:
        self._dial = dial
        self._header = header
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            upstream = self._dial()
            self._sockets += [client, upstream]
            if self._header is not None:
                upstream.sendall(self._header(client))
            for source, sink in ((client, upstream), (upstream, client)):
                thread = threading.Thread(target=self._pump, args=(source, sink), daemon=True)
                self._threads.append(thread)
                thread.start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._stop.set()
        self._listener.close()
        for sock in self._sockets:
            sock.close()
        for thread in self._threads:
            thread.join(TIMEOUT_S)


def v1_header(source: str, source_port: int) -> Header:
    def header(client: socket.socket) -> bytes:
        family = "TCP6" if ":" in source else "TCP4"
        destination = "::1" if family == "TCP6" else "127.0.0.1"
        return f"PROXY {family} {source} {destination} {source_port} 5672\r\n".encode()

    return header


def v2_header(source: str, source_port: int, *, local: bool = False) -> Header:
    def header(client: socket.socket) -> bytes:
        address = ipaddress.ip_address(source)
        family = 0x11 if address.version == 4 else 0x21
        destination = ipaddress.ip_address("10.0.0.1" if address.version == 4 else "::1")
        block = address.packed + destination.packed + struct.pack(">HH", source_port, 5672)
        block += struct.pack(">BH", 0xEA, 9) + b"vpce-0123"  # a TLV, as AWS NLB sends
        command = 0x20 if local else 0x21
        return V2_SIGNATURE + bytes([command, family]) + struct.pack(">H", len(block)) + block

    return header


def tcp_dial(port: int) -> Callable[[], socket.socket]:
    return lambda: socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)


def unix_dial(path: str) -> Callable[[], socket.socket]:
    def dial() -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(TIMEOUT_S)
        sock.connect(path)
        return sock

    return dial


@contextlib.contextmanager
def relay(dial: Callable[[], socket.socket], header: Header | None = None) -> Iterator[Relay]:
    running = Relay(dial, header)
    try:
        yield running
    finally:
        running.close()


def pika_connect(
    port: int, user: str = "guest", password: str = "guest"
) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1",
            port,
            credentials=pika.PlainCredentials(user, password),
            socket_timeout=TIMEOUT_S,
            blocked_connection_timeout=TIMEOUT_S,
        )
    )


def round_trip(connection: pika.BlockingConnection) -> None:
    """Publish with confirms and consume back: the connection serves AMQP in full."""
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("relayed")
    for i in range(50):
        channel.basic_publish("", "relayed", f"m{i}".encode())
    got = []
    for _method, _properties, body in channel.consume("relayed", inactivity_timeout=TIMEOUT_S):
        assert body is not None, "a message did not come back"
        got.append(body)
        if len(got) == 50:
            break
    channel.cancel()
    assert got == [f"m{i}".encode() for i in range(50)]


def connections(broker: RunningBroker) -> list[dict[str, object]]:
    status, listed, _ = broker.http("GET", "/api/connections")
    assert status == 200 and isinstance(listed, list)
    return listed


def wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def raw_handshake(sock: socket.socket, *, sent_first: bytes = b"") -> Reader:
    """Open a connection as guest over `sock` (after `sent_first`, sent with the AMQP
    protocol header in one segment); fails unless connection.open-ok comes."""
    reader = Reader(sock)
    sock.sendall(sent_first + AMQP_HEADER)
    reader.until(received(m.ConnectionStart))
    start_ok = m.ConnectionStartOk(mechanism="PLAIN", response=b"\x00guest\x00guest")
    sock.sendall(codec.encode_method_frame(codec.ChannelId(0), start_ok))
    reader.until(received(m.ConnectionTune))
    tune_ok = m.ConnectionTuneOk(channel_max=2047, frame_max=FRAME_MAX, heartbeat=0)
    sock.sendall(codec.encode_method_frame(codec.ChannelId(0), tune_ok))
    sock.sendall(codec.encode_method_frame(codec.ChannelId(0), m.ConnectionOpen("/")))
    reader.until(received(m.ConnectionOpenOk))
    return reader


def closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(4096) == b""
    except ConnectionResetError:
        return True


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    # A unix socket's path is limited to 107 bytes: pytest's tmp_path can be longer.
    path = Path(tempfile.mkdtemp(prefix="streamq-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def add_user() -> Callable[[RunningBroker, str], None]:
    def add(broker: RunningBroker, name: str) -> None:
        assert broker.http("PUT", f"/api/users/{name}", {"password": "pw", "tags": ""})[0] in (
            201,
            204,
        )
        permissions = {"configure": ".*", "write": ".*", "read": ".*"}
        assert broker.http("PUT", f"/api/permissions/%2F/{name}", permissions)[0] in (201, 204)

    return add


# -- the unix socket ---------------------------------------------------------------------


def test_pika_through_a_relay_to_the_unix_socket(tmp_path: Path, socket_dir: Path) -> None:
    path = str(socket_dir / "amqp.sock")
    broker = RunningBroker(tmp_path / "data", amqp_unix_path=path)
    try:
        assert ("amqp", path, 0) in broker.listeners
        assert oct(os.stat(path).st_mode & 0o777) == oct(0o666)
        with relay(unix_dial(path)) as through, pika_connect(through.port) as connection:
            # guest logs in: a unix socket's client is on this host (LavinMQ's rule).
            round_trip(connection)
            [listed] = connections(broker)
            assert listed["peer_host"] == "unix" and listed["host"] == path
            assert listed["name"] == f"unix:{listed['peer_port']} -> {path}:0"
            assert listed["user"] == "guest"
    finally:
        broker.stop()
    assert not os.path.exists(path), "the socket file outlived the broker"


def test_raw_handshake_on_the_unix_socket_and_distinct_names(
    tmp_path: Path, socket_dir: Path
) -> None:
    path = str(socket_dir / "amqp.sock")
    broker = RunningBroker(tmp_path / "data", amqp_unix_path=path)
    try:
        with unix_dial(path)() as first, unix_dial(path)() as second:
            raw_handshake(first)
            raw_handshake(second)
            wait_for(lambda: len(connections(broker)) == 2)
            names = {c["name"] for c in connections(broker)}
            assert len(names) == 2
        wait_for(lambda: connections(broker) == [])
    finally:
        broker.stop()


def test_a_stale_socket_file_is_replaced(tmp_path: Path, socket_dir: Path) -> None:
    path = str(socket_dir / "amqp.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(path)  # a socket file nobody listens on: what a killed broker leaves
    broker = RunningBroker(tmp_path / "data", amqp_unix_path=path)
    try:
        with unix_dial(path)() as sock:
            raw_handshake(sock)
    finally:
        broker.stop()


def test_a_path_that_is_not_a_socket_is_refused(tmp_path: Path, socket_dir: Path) -> None:
    path = socket_dir / "amqp.sock"
    path.write_text("not a socket")
    with pytest.raises(ServeError, match="exists and is not a socket"):
        RunningBroker(tmp_path / "data", amqp_unix_path=str(path))
    assert path.read_text() == "not a socket"


def test_a_live_socket_is_not_taken_over(tmp_path: Path, socket_dir: Path) -> None:
    path = str(socket_dir / "amqp.sock")
    first = RunningBroker(tmp_path / "one", amqp_unix_path=path)
    try:
        with pytest.raises(ServeError, match="another process listens"):
            RunningBroker(tmp_path / "two", amqp_unix_path=path)
        with unix_dial(path)() as sock:
            raw_handshake(sock)  # the first broker still serves its socket
    finally:
        first.stop()


# -- PROXY protocol ----------------------------------------------------------------------


@pytest.mark.parametrize("version", [1, 2])
def test_a_relayed_client_is_shown_with_the_address_of_its_header(
    tmp_path: Path, version: int
) -> None:
    broker = RunningBroker(tmp_path / "data", tcp_proxy_protocol=version)
    header = (v1_header if version == 1 else v2_header)("127.9.8.7", 40001)
    try:
        with (
            relay(tcp_dial(broker.amqp_port), header) as through,
            pika_connect(through.port) as connection,
        ):
            round_trip(connection)  # guest: 127.9.8.7 is a loopback address
            [listed] = connections(broker)
            assert (listed["peer_host"], listed["peer_port"]) == ("127.9.8.7", 40001)
            destination = "127.0.0.1" if version == 1 else "10.0.0.1"
            assert listed["name"] == f"127.9.8.7:40001 -> {destination}:5672"
    finally:
        broker.stop()


def test_the_header_address_decides_the_loopback_rule(
    tmp_path: Path, add_user: Callable[[RunningBroker, str], None]
) -> None:
    broker = RunningBroker(tmp_path / "data", tcp_proxy_protocol=2)
    try:
        add_user(broker, "alice")
        with relay(tcp_dial(broker.amqp_port), v2_header("2001:db8::7", 50000)) as through:
            # guest may log in from loopback only: the client is 2001:db8::7, not the relay.
            with pytest.raises(pika.exceptions.AMQPConnectionError):
                pika_connect(through.port)
            with pika_connect(through.port, "alice", "pw") as connection:
                round_trip(connection)
                [listed] = connections(broker)
                assert (listed["peer_host"], listed["peer_port"]) == ("2001:db8::7", 50000)
                assert listed["host"] == "::1"
    finally:
        broker.stop()


def test_v2_local_keeps_the_socket_address(tmp_path: Path) -> None:
    broker = RunningBroker(tmp_path / "data", tcp_proxy_protocol=2)
    try:
        with (
            relay(tcp_dial(broker.amqp_port), v2_header("192.0.2.1", 1, local=True)) as through,
            pika_connect(through.port) as connection,
        ):
            round_trip(connection)
            [listed] = connections(broker)
            assert listed["peer_host"] == "127.0.0.1"  # the relay's socket, not 192.0.2.1
            assert listed["port"] == broker.amqp_port
    finally:
        broker.stop()


def test_no_header_is_refused_and_the_broker_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broker = RunningBroker(tmp_path / "data", tcp_proxy_protocol=1)
    try:
        with caplog.at_level(logging.WARNING, logger="amqp_gateway.listeners"):
            started = time.monotonic()
            with pytest.raises(pika.exceptions.AMQPConnectionError):
                pika_connect(broker.amqp_port)  # a plain AMQP client on a PROXY listener
            assert time.monotonic() - started < listeners.PROXY_HEADER_TIMEOUT_S
            wait_for(lambda: "no PROXY protocol header" in caplog.text)
        assert "closing AMQP connection from 127.0.0.1:" in caplog.text
        with (
            relay(tcp_dial(broker.amqp_port), v1_header("127.0.0.5", 7)) as through,
            pika_connect(through.port) as connection,
        ):
            round_trip(connection)
    finally:
        broker.stop()


def test_a_stalled_header_is_closed_within_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(listeners, "PROXY_HEADER_TIMEOUT_S", 0.5)
    broker = RunningBroker(tmp_path / "data", tcp_proxy_protocol=1)
    try:
        with caplog.at_level(logging.WARNING, logger="amqp_gateway.listeners"):
            with socket.create_connection(("127.0.0.1", broker.amqp_port)) as sock:
                sock.settimeout(TIMEOUT_S)
                sock.sendall(b"PROXY TCP4 192.0.2.1")  # and nothing more
                started = time.monotonic()
                assert closed_by_peer(sock)
                waited = time.monotonic() - started
            assert 0.3 < waited < 3, waited
            wait_for(lambda: "no complete PROXY protocol header within 0.5 s" in caplog.text)
        with (
            relay(tcp_dial(broker.amqp_port), v1_header("127.0.0.5", 7)) as through,
            pika_connect(through.port) as connection,
        ):
            round_trip(connection)
    finally:
        broker.stop()


def test_a_header_split_into_bytes_then_amqp_in_the_same_segment(tmp_path: Path) -> None:
    broker = RunningBroker(tmp_path / "data", tcp_proxy_protocol=2)
    header = b"PROXY TCP4 127.3.3.3 127.0.0.1 33333 5672\r\n"
    try:
        with socket.create_connection(("127.0.0.1", broker.amqp_port)) as sock:
            sock.settimeout(TIMEOUT_S)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for byte in header[:-2]:
                sock.sendall(bytes([byte]))
                time.sleep(0.002)
            # The header's end and the AMQP protocol header arrive in one read: the
            # session gets those bytes unchanged.
            raw_handshake(sock, sent_first=header[-2:])
            [listed] = connections(broker)
            assert (listed["peer_host"], listed["peer_port"]) == ("127.3.3.3", 33333)
    finally:
        broker.stop()


def test_proxy_protocol_on_the_unix_socket(tmp_path: Path, socket_dir: Path) -> None:
    path = str(socket_dir / "amqp.sock")
    broker = RunningBroker(tmp_path / "data", amqp_unix_path=path, unix_proxy_protocol=1)
    try:
        with unix_dial(path)() as sock:
            raw_handshake(sock, sent_first=v2_header("127.4.4.4", 4444)(sock))
            [listed] = connections(broker)
            assert (listed["peer_host"], listed["peer_port"]) == ("127.4.4.4", 4444)
        with unix_dial(path)() as sock:
            sock.sendall(AMQP_HEADER)  # no header: refused
            assert closed_by_peer(sock)
        with unix_dial(path)() as sock:  # v1 UNKNOWN: the unix socket's own endpoints
            raw_handshake(sock, sent_first=b"PROXY UNKNOWN\r\n")
            wait_for(lambda: [c["peer_host"] for c in connections(broker)] == ["unix"])
    finally:
        broker.stop()
