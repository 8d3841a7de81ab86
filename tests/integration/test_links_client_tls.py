"""The links' client over amqps:// against a streamq with TLS listeners: RabbitMQ's URI
query parameters (cacertfile, certfile, keyfile, verify, server_name_indication) decide
what is trusted, and each refusal is a one-line reason, never a hang."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from streamq.links.amqp.client import AmqpConnectionError, Connection
from streamq.links.amqp.uri import parse_uri
from tests.integration.conftest import RunningBroker
from tests.integration.test_links_client import run, transfer
from tests.integration.tls_setup import Certs, pki, port_of, tls_broker

__all__ = ["pki"]  # the module-scoped certificates fixture


@pytest.fixture(scope="module")
def tls_running(pki: Certs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    running = tls_broker(
        tmp_path_factory.mktemp("links-tls"),
        pki.server,
        tls_verify_peer=True,
        tls_ca_cert=str(pki.ca.cert),
    )
    yield running
    running.stop()


def amqps(broker: RunningBroker, query: str, user: str = "guest:guest@") -> str:
    return f"amqps://{user}127.0.0.1:{port_of(broker, 'amqp/ssl')}/%2f?{query}"


def test_amqps_with_the_ca_and_a_client_certificate(tls_running: RunningBroker, pki: Certs) -> None:
    query = (
        f"cacertfile={pki.ca.cert}&certfile={pki.client_guest.cert}"
        f"&keyfile={pki.client_guest.key}&verify=verify_peer"
    )
    confirms, collector = run(transfer(amqps(tls_running, query), "links-tls", 1000))
    assert confirms.upto == 1000 and len(collector.deliveries) == 1000


def test_external_login_by_the_client_certificate(tls_running: RunningBroker, pki: Certs) -> None:
    query = (
        f"cacertfile={pki.ca.cert}&certfile={pki.client_guest.cert}"
        f"&keyfile={pki.client_guest.key}&auth_mechanism=external"
    )

    async def scenario() -> None:
        connection = await Connection.connect(parse_uri(amqps(tls_running, query, "")), name="x")
        await connection.channel()
        await connection.close()

    run(scenario())


def test_an_unknown_ca_fails_the_handshake(tls_running: RunningBroker, pki: Certs) -> None:
    query = f"cacertfile={pki.other_ca.cert}"
    with pytest.raises(
        AmqpConnectionError,
        match=r"TLS handshake with 127\.0\.0\.1:\d+ failed: certificate verify failed",
    ):
        run(Connection.connect(parse_uri(amqps(tls_running, query)), name="x"))


def test_server_name_indication_is_checked(tls_running: RunningBroker, pki: Certs) -> None:
    query = f"cacertfile={pki.ca.cert}&server_name_indication=elsewhere.example"
    with pytest.raises(AmqpConnectionError, match=r"Hostname mismatch|doesn't match"):
        run(Connection.connect(parse_uri(amqps(tls_running, query)), name="x"))


def test_verify_none_trusts_any_certificate(tmp_path: Path, pki: Certs) -> None:
    """No client certificate asked here: verify_none alone connects to an unknown CA."""
    broker = tls_broker(tmp_path, pki.server)
    try:
        confirms, _ = run(transfer(amqps(broker, "verify=verify_none"), "links-tls-any", 10))
    finally:
        broker.stop()
    assert confirms.upto == 10
