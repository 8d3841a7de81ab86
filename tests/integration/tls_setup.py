"""What the TLS tests share: certificates made by openssl (certs.py) once per module, a
broker with its TLS ports on, and clients that trust the test CA."""

from __future__ import annotations

import socket
import ssl
import time
from dataclasses import dataclass
from pathlib import Path

import pika
import pytest

from tests.integration import certs
from tests.integration.conftest import RunningBroker

TIMEOUT_S = 10


@dataclass(frozen=True)
class Certs:
    ca: certs.Pair
    server: certs.Pair
    other_ca: certs.Pair
    expired_server: certs.Pair
    intermediate: certs.Pair
    leaf_of_intermediate: certs.Pair
    client_guest: certs.Pair
    client_alice: certs.Pair
    client_unknown: certs.Pair
    client_expired: certs.Pair
    client_other_ca: certs.Pair
    directory: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    d = tmp_path_factory.mktemp("pki")
    ca = certs.make_ca(d, "ca")
    other = certs.make_ca(d, "other-ca")
    intermediate = certs.issue(d, ca, "intermediate", kind="ca")
    return Certs(
        ca=ca,
        server=certs.issue(d, ca, "server", cn="localhost"),
        other_ca=other,
        expired_server=certs.issue(d, ca, "expired-server", cn="localhost", days=-1),
        intermediate=intermediate,
        leaf_of_intermediate=certs.issue(d, intermediate, "leaf", cn="localhost"),
        client_guest=certs.issue(d, ca, "client-guest", kind="client", cn="guest"),
        client_alice=certs.issue(d, ca, "client-alice", kind="client", cn="alice"),
        client_unknown=certs.issue(d, ca, "client-nobody", kind="client", cn="nobody"),
        client_expired=certs.issue(d, ca, "client-expired", kind="client", cn="guest", days=-1),
        client_other_ca=certs.issue(d, other, "client-other", kind="client", cn="guest"),
        directory=d,
    )


def tls_broker(tmp_path: Path, server: certs.Pair, **settings: object) -> RunningBroker:
    keys: dict[str, object] = {"tls_cert": str(server.cert), "tls_key": str(server.key)}
    return RunningBroker(tmp_path / "data", amqps_port=0, https_port=0, **{**keys, **settings})


def port_of(broker: RunningBroker, protocol: str) -> int:
    ports = [port for name, _, port in broker.listeners if name == protocol]
    assert len(ports) == 1, broker.listeners
    return ports[0]


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), TIMEOUT_S)


def handshake(port: int, context: ssl.SSLContext) -> ssl.SSLSocket:
    """A TLS connection to the port, handshake done; raises what the handshake raised."""
    raw = connect(port)
    try:
        return context.wrap_socket(raw, server_hostname="localhost")
    except BaseException:
        raw.close()
        raise


def client_context(ca: certs.Pair, client: certs.Pair | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca.cert))
    if client is not None:
        context.load_cert_chain(str(client.cert), str(client.key))
    return context


def pika_params(
    port: int, context: ssl.SSLContext, credentials: pika.credentials.VALID_TYPES | None = None
) -> pika.ConnectionParameters:
    return pika.ConnectionParameters(
        "127.0.0.1",
        port,
        credentials=credentials or pika.PlainCredentials("guest", "guest"),
        ssl_options=pika.SSLOptions(context, "localhost"),
        socket_timeout=TIMEOUT_S,
        blocked_connection_timeout=TIMEOUT_S,
    )


def plain_client_works(broker: RunningBroker) -> None:
    """The broker goes on: a plain AMQP client connects and declares a queue."""
    connection = pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", broker.amqp_port, socket_timeout=TIMEOUT_S)
    )
    connection.channel().queue_declare("still-alive")
    connection.close()


def wait_for_log(caplog: pytest.LogCaptureFixture, text: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not any(text in record.getMessage() for record in caplog.records):
        assert time.monotonic() < deadline, f"no log line with {text!r}: {caplog.text}"
        time.sleep(0.02)
