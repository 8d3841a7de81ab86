"""Client certificates (tls_verify_peer with tls_ca_cert) and SASL EXTERNAL.

The broker asks every AMQPS client for a certificate signed by the test CA (RabbitMQ's
verify_peer + fail_if_no_peer_cert) and offers EXTERNAL, which logs the client in as the
certificate's CN (rabbitmq_auth_mechanism_ssl). pika logs in with ExternalCredentials;
raw sockets read what connection.start offers and what a start-ok with EXTERNAL gets
where it is not offered. Refused certificates end the handshake with a log line, and the
broker goes on.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.credentials
import pika.exceptions
import pytest

from amqp_gateway import codec
from amqp_gateway.codec import methods as m
from amqp_gateway.codec.ids import ChannelId
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

EXTERNAL = pika.credentials.ExternalCredentials()


@pytest.fixture
def broker(tmp_path: Path, pki: Certs) -> Iterator[RunningBroker]:
    running = tls_broker(tmp_path, pki.server, tls_verify_peer=True, tls_ca_cert=str(pki.ca.cert))
    yield running
    running.stop()


def external_login(
    broker: RunningBroker, pki: Certs, client: certs.Pair
) -> pika.BlockingConnection:
    params = pika_params(port_of(broker, "amqp/ssl"), client_context(pki.ca, client), EXTERNAL)
    return pika.BlockingConnection(params)


def read_start(sock: socket.socket) -> m.ConnectionStart:
    """Send the protocol header and read the server's connection.start."""
    sock.sendall(codec.PROTOCOL_HEADER_0_9_1)
    data = b""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionAbortedError("closed before connection.start")
        data += chunk
        frames, _ = codec.split_frames(data, 131072)
        if frames:
            method = codec.decode_method(frames[0][2])
            assert isinstance(method, m.ConnectionStart)
            return method
    raise AssertionError("no connection.start")


def test_external_login_as_guest(broker: RunningBroker, pki: Certs) -> None:
    connection = external_login(broker, pki, pki.client_guest)
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("ext")
        channel.basic_publish("", "ext", b"by certificate")
        method, _, body = channel.basic_get("ext", auto_ack=True)
        assert method is not None and body == b"by certificate"
        # The management API shows the login and the TLS session as RabbitMQ does.
        _, listed, _ = broker.http("GET", "/api/connections")
        assert isinstance(listed, list) and len(listed) == 1
        shown = listed[0]
        assert shown["user"] == "guest"
        assert shown["auth_mechanism"] == "EXTERNAL"
        assert shown["ssl"] is True
        assert shown["ssl_protocol"] in ("tlsv1.2", "tlsv1.3")
        assert shown["ssl_cipher"]
        assert "CN=guest" in shown["peer_cert_subject"].split(",")
        assert "CN=ca" in shown["peer_cert_issuer"].split(",")
    finally:
        connection.close()


def test_external_login_as_a_user_without_password_with_its_permissions(
    broker: RunningBroker, pki: Certs
) -> None:
    assert broker.http("PUT", "/api/users/alice", {"password_hash": "", "tags": ""})[0] == 201
    grant = {"configure": "^alice-", "write": "^alice-", "read": "^alice-"}
    assert broker.http("PUT", "/api/permissions/%2F/alice", grant)[0] == 201
    connection = external_login(broker, pki, pki.client_alice)
    try:
        channel = connection.channel()
        channel.queue_declare("alice-q")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="ACCESS_REFUSED"):
            channel.queue_declare("bob-q")
    finally:
        connection.close()


def test_external_login_with_an_unknown_cn_is_refused(broker: RunningBroker, pki: Certs) -> None:
    with pytest.raises(pika.exceptions.ProbableAuthenticationError, match="ACCESS_REFUSED"):
        external_login(broker, pki, pki.client_unknown)
    plain_client_works(broker)


def test_plain_login_still_works_with_a_client_certificate(
    broker: RunningBroker, pki: Certs
) -> None:
    params = pika_params(port_of(broker, "amqp/ssl"), client_context(pki.ca, pki.client_alice))
    connection = pika.BlockingConnection(params)  # PLAIN guest/guest
    connection.channel().queue_declare("plain-over-tls")
    connection.close()


def test_external_offered_only_with_a_client_certificate(
    broker: RunningBroker, tmp_path: Path, pki: Certs
) -> None:
    with handshake(port_of(broker, "amqp/ssl"), client_context(pki.ca, pki.client_guest)) as sock:
        assert read_start(sock).mechanisms.split() == [b"PLAIN", b"AMQPLAIN", b"EXTERNAL"]
    with connect(broker.amqp_port) as sock:
        assert read_start(sock).mechanisms.split() == [b"PLAIN", b"AMQPLAIN"]
    no_verify = tls_broker(tmp_path / "no-verify", pki.server)
    try:  # TLS without client certificates: nothing to log in as
        with handshake(port_of(no_verify, "amqp/ssl"), client_context(pki.ca)) as sock:
            assert read_start(sock).mechanisms.split() == [b"PLAIN", b"AMQPLAIN"]
    finally:
        no_verify.stop()


def test_external_over_plain_tcp_is_not_offered(broker: RunningBroker) -> None:
    params = pika.ConnectionParameters(
        "127.0.0.1", broker.amqp_port, credentials=EXTERNAL, socket_timeout=TIMEOUT_S
    )
    with pytest.raises(pika.exceptions.AuthenticationError, match="EXTERNAL"):
        pika.BlockingConnection(params)
    plain_client_works(broker)


def test_raw_start_ok_with_external_over_plain_tcp(broker: RunningBroker) -> None:
    """As RabbitMQ: command_invalid "invalid authentication mechanism" before tune, which
    closes the socket without connection.close (the spec's rule for a bad mechanism)."""
    with connect(broker.amqp_port) as sock:
        read_start(sock)
        capabilities = {"authentication_failure_close": True}
        start_ok = m.ConnectionStartOk(
            client_properties={"capabilities": capabilities}, mechanism="EXTERNAL", response=b""
        )
        sock.sendall(codec.encode_method_frame(ChannelId(0), start_ok))
        sock.settimeout(TIMEOUT_S)
        assert sock.recv(65536) == b""  # closed, no connection.tune nor close
    plain_client_works(broker)


@pytest.mark.parametrize(
    ("client", "reason"),
    [
        (None, "peer did not return a certificate"),
        ("client_expired", "certificate verify failed: certificate has expired"),
        ("client_other_ca", "certificate verify failed: unable to get local issuer"),
    ],
)
def test_client_certificate_refused(
    broker: RunningBroker,
    pki: Certs,
    caplog: pytest.LogCaptureFixture,
    client: str | None,
    reason: str,
) -> None:
    context = client_context(pki.ca, getattr(pki, client) if client else None)
    with caplog.at_level(logging.WARNING, logger="streamq.tls"):
        # TLS 1.3: the client's handshake ends before the server has checked the
        # client's certificate; the refusal comes with the first read.
        with pytest.raises(OSError), handshake(port_of(broker, "amqp/ssl"), context) as sock:
            read_start(sock)
        wait_for_log(caplog, reason)
    plain_client_works(broker)
