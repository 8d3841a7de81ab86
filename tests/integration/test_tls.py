"""AMQPS and HTTPS: real certificates made by the tests (certs.py), real clients.

The broker runs in-process with its TLS ports on 0 (`RunningBroker(..., amqps_port=0,
https_port=0, tls_cert=..., tls_key=...)`); the bound ports come from its listeners.
pika and aio-pika talk AMQP over TLS, urllib the management API over HTTPS; the bad
cases (a plain client on the TLS port, a stalled handshake, untrusted or expired
certificates) each end in a clean refusal, a log line, and a broker that goes on.
"""

from __future__ import annotations

import json
import logging
import socket
import ssl
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from amqp_gateway import codec
from streamq import tls
from streamq.app import ServeError
from tests.integration import certs
from tests.integration.conftest import RunningBroker
from tests.integration.tls_setup import (
    TIMEOUT_S,
    Certs,
    client_context,
    connect,
    handshake,
    pika_params,
    pki,
    plain_client_works,
    port_of,
    tls_broker,
    wait_for_log,
)

__all__ = ["pki"]  # a fixture, used by name


def round_trip(channel: BlockingChannel, queue: str, count: int) -> list[bytes]:
    """Publish `count` messages under confirms, consume them with acks."""
    channel.confirm_delivery()
    channel.queue_declare(queue, durable=True)
    for i in range(count):
        channel.basic_publish("", queue, str(i).encode(), pika.BasicProperties(delivery_mode=2))
    received: list[bytes] = []
    for method, _, body in channel.consume(queue, inactivity_timeout=TIMEOUT_S):
        assert method is not None, "no delivery within the timeout"
        channel.basic_ack(method.delivery_tag)
        received.append(body)
        if len(received) == count:
            break
    channel.cancel()
    return received


@pytest.fixture
def broker(tmp_path: Path, pki: Certs) -> Iterator[RunningBroker]:
    running = tls_broker(tmp_path, pki.server)
    yield running
    running.stop()


# -- AMQPS ---------------------------------------------------------------------------------


def test_pika_over_tls_publishes_with_confirms_and_consumes(
    broker: RunningBroker, pki: Certs
) -> None:
    connection = pika.BlockingConnection(
        pika_params(port_of(broker, "amqp/ssl"), client_context(pki.ca))
    )
    try:
        assert round_trip(connection.channel(), "tls-q", 500) == [
            str(i).encode() for i in range(500)
        ]
    finally:
        connection.close()
    _, connections, _ = broker.http("GET", "/api/connections")
    assert isinstance(connections, list)


async def test_aio_pika_over_tls(broker: RunningBroker, pki: Certs) -> None:
    port = port_of(broker, "amqp/ssl")
    connection = await aio_pika.connect(
        host="127.0.0.1",
        port=port,
        login="guest",
        password="guest",
        ssl=True,
        ssl_context=client_context(pki.ca),
        timeout=TIMEOUT_S,
    )
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        queue = await channel.declare_queue("aio-tls", durable=True)
        for i in range(200):
            await channel.default_exchange.publish(
                aio_pika.Message(str(i).encode(), delivery_mode=2), routing_key="aio-tls"
            )
        received = []
        async with queue.iterator() as messages:
            async for message in messages:
                async with message.process():
                    received.append(message.body)
                if len(received) == 200:
                    break
    assert received == [str(i).encode() for i in range(200)]


def test_large_messages_over_tls(broker: RunningBroker, pki: Certs) -> None:
    """Bodies bigger than a TLS record and than frame_max cross intact."""
    connection = pika.BlockingConnection(
        pika_params(port_of(broker, "amqp/ssl"), client_context(pki.ca))
    )
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("big")
        bodies = [bytes([i]) * (1 << 20) + bytes(range(256)) for i in range(5)]
        for body in bodies:
            channel.basic_publish("", "big", body)
        got = [channel.basic_get("big", auto_ack=True)[2] for _ in bodies]
    finally:
        connection.close()
    assert got == bodies


def test_listeners_in_overview_over_https(broker: RunningBroker, pki: Certs) -> None:
    https = port_of(broker, "https")
    request = urllib.request.Request(
        f"https://localhost:{https}/api/overview",
        headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="},  # guest:guest
    )
    with urllib.request.urlopen(request, context=client_context(pki.ca), timeout=TIMEOUT_S) as r:
        overview = json.loads(r.read())
    listed = {(entry["protocol"], entry["port"]) for entry in overview["listeners"]}
    assert listed == {
        ("amqp", broker.amqp_port),
        ("http", broker.http_port),
        ("amqp/ssl", port_of(broker, "amqp/ssl")),
        ("https", https),
    }
    for entry in overview["listeners"]:
        assert set(entry) >= {"node", "protocol", "ip_address", "port", "socket_opts"}
        assert entry["ip_address"] == "127.0.0.1"


def test_chain_file_with_an_intermediate_ca(tmp_path: Path, pki: Certs) -> None:
    """The client trusts only the root: the server must send the intermediate too."""
    chained = certs.chain(tmp_path, "chained", pki.leaf_of_intermediate, pki.intermediate)
    running = tls_broker(tmp_path, certs.Pair(chained, pki.leaf_of_intermediate.key))
    try:
        connection = pika.BlockingConnection(
            pika_params(port_of(running, "amqp/ssl"), client_context(pki.ca))
        )
        connection.channel().queue_declare("chained")
        connection.close()
    finally:
        running.stop()


def test_key_in_the_certificate_file(tmp_path: Path, pki: Certs) -> None:
    both = tmp_path / "both.pem"
    both.write_text(pki.server.cert.read_text() + pki.server.key.read_text())
    running = tls_broker(tmp_path, pki.server, tls_cert=str(both), tls_key="")
    try:
        with handshake(port_of(running, "amqp/ssl"), client_context(pki.ca)) as sock:
            sock.sendall(codec.PROTOCOL_HEADER_0_9_1)
            assert sock.recv(7)[:1] == bytes([codec.FRAME_METHOD])
    finally:
        running.stop()


def test_tls_min_version_13_refuses_a_tls12_client(tmp_path: Path, pki: Certs) -> None:
    running = tls_broker(tmp_path, pki.server, tls_min_version="1.3")
    try:
        old = client_context(pki.ca)
        old.maximum_version = ssl.TLSVersion.TLSv1_2
        with pytest.raises(ssl.SSLError, match=r"(?i)version|protocol"):
            handshake(port_of(running, "amqp/ssl"), old)
        with handshake(port_of(running, "amqp/ssl"), client_context(pki.ca)) as sock:
            assert sock.version() == "TLSv1.3"
    finally:
        running.stop()


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1:DeprecationWarning")
def test_default_minimum_is_tls12(broker: RunningBroker, pki: Certs) -> None:
    old = client_context(pki.ca)
    old.minimum_version = ssl.TLSVersion.TLSv1
    old.maximum_version = ssl.TLSVersion.TLSv1_1
    old.set_ciphers("DEFAULT:@SECLEVEL=0")
    with pytest.raises(ssl.SSLError):
        handshake(port_of(broker, "amqp/ssl"), old)
    tls12 = client_context(pki.ca)
    tls12.maximum_version = ssl.TLSVersion.TLSv1_2
    with handshake(port_of(broker, "amqp/ssl"), tls12) as sock:
        assert sock.version() == "TLSv1.2"


def test_ciphers_apply_to_tls12(tmp_path: Path, pki: Certs) -> None:
    running = tls_broker(tmp_path, pki.server, tls_ciphers="ECDHE-ECDSA-AES128-GCM-SHA256")
    try:
        tls12 = client_context(pki.ca)
        tls12.maximum_version = ssl.TLSVersion.TLSv1_2
        with handshake(port_of(running, "amqp/ssl"), tls12) as sock:
            cipher = sock.cipher()
            assert cipher is not None and cipher[0] == "ECDHE-ECDSA-AES128-GCM-SHA256"
    finally:
        running.stop()


# -- start-up errors -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"tls_cert": ""}, "needs tls_cert"),
        ({"tls_cert": "/nonexistent/cert.pem"}, "/nonexistent/cert.pem"),
        ({"tls_ciphers": "NO-SUCH-CIPHER"}, "tls_ciphers 'NO-SUCH-CIPHER'"),
        ({"tls_min_version": "1.1"}, "tls_min_version must be 1.2 or 1.3"),
        ({"tls_verify_peer": True}, "tls_verify_peer needs tls_ca_cert"),
        ({"tls_verify_peer": True, "tls_ca_cert": "/nonexistent/ca.pem"}, "/nonexistent/ca.pem"),
    ],
)
def test_bad_tls_settings_stop_the_start(
    tmp_path: Path, pki: Certs, settings: dict[str, object], message: str
) -> None:
    merged: dict[str, object] = {"tls_cert": str(pki.server.cert), "tls_key": str(pki.server.key)}
    merged.update(settings)
    with pytest.raises(ServeError, match=f"TLS: .*{message}"):
        RunningBroker(tmp_path / "data", amqps_port=0, **merged)


def test_key_not_matching_the_certificate_stops_the_start(tmp_path: Path, pki: Certs) -> None:
    with pytest.raises(ServeError, match=r"(?i)TLS: .*key values mismatch"):
        RunningBroker(
            tmp_path / "data",
            https_port=0,
            tls_cert=str(pki.server.cert),
            tls_key=str(pki.client_guest.key),
        )


# -- bad input: clean refusal, a log line, the broker goes on -----------------------------


def read_all(sock: socket.socket, deadline: float) -> bytes:
    data = b""
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except (TimeoutError, ConnectionResetError):
            break
        if not chunk:
            break
        data += chunk
    return data


def test_plain_amqp_client_on_the_tls_port(
    broker: RunningBroker, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="streamq.tls"):
        with connect(port_of(broker, "amqp/ssl")) as sock:
            sock.sendall(codec.PROTOCOL_HEADER_0_9_1)
            answer = read_all(sock, time.monotonic() + TIMEOUT_S)
        assert codec.PROTOCOL_HEADER_0_9_1 not in answer  # a TLS alert at most, then EOF
        wait_for_log(caplog, "AMQPS: TLS handshake with 127.0.0.1:")
    plain_client_works(broker)


def test_tls_client_on_the_plain_port(broker: RunningBroker, pki: Certs) -> None:
    with pytest.raises((ssl.SSLError, ConnectionResetError, OSError)):
        handshake(broker.amqp_port, client_context(pki.ca))
    plain_client_works(broker)


def test_stalled_handshake_is_dropped_in_bounded_time(
    broker: RunningBroker, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(tls, "HANDSHAKE_TIMEOUT_S", 0.5)
    with caplog.at_level(logging.WARNING, logger="streamq.tls"):
        with connect(port_of(broker, "amqp/ssl")) as sock:
            sock.sendall(b"\x16\x03\x01")  # the start of a TLS record, then nothing
            started = time.monotonic()
            assert read_all(sock, started + TIMEOUT_S) == b""
            assert time.monotonic() - started < 5
        wait_for_log(caplog, "SSL handshake is taking longer than 0.5 seconds")
    plain_client_works(broker)


def test_client_not_trusting_the_server(
    broker: RunningBroker, pki: Certs, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="streamq.tls"):
        with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer"):
            handshake(port_of(broker, "amqp/ssl"), client_context(pki.other_ca))
        wait_for_log(caplog, "AMQPS: TLS handshake with 127.0.0.1:")
    plain_client_works(broker)


def test_expired_server_certificate_is_refused_by_the_client(tmp_path: Path, pki: Certs) -> None:
    running = tls_broker(tmp_path, pki.expired_server)
    try:
        with pytest.raises(ssl.SSLCertVerificationError, match="certificate has expired"):
            handshake(port_of(running, "amqp/ssl"), client_context(pki.ca))
        plain_client_works(running)
    finally:
        running.stop()
