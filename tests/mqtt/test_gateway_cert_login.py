"""Login by TLS client certificate on the MQTTS port (`[mqtt] ssl_cert_login`, RabbitMQ's
mqtt.ssl_cert_login), with certificates made by openssl (tests/integration/certs.py):
the broker verifies every client's certificate against the test CA (tls_verify_peer);
a CONNECT without user name and password logs in as the certificate's CN into
`default_vhost`, no password checked, with that user's permissions, listed with
auth_mechanism EXTERNAL. Credentials, when given, are checked as ever; an unknown CN, or
the setting off, is refused with CONNACK 4 (5.0: 0x86)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration import certs
from tests.integration.conftest import RunningBroker
from tests.integration.tls_setup import Certs, client_context, pki, port_of
from tests.mqtt.clients import Paho

__all__ = ["pki"]  # the module-scoped certificates fixture

BAD_CREDENTIALS_V5 = 0x86  # paho reports 3.1.1's return code 4 as 5.0's reason code


def cert_broker(tmp_path: Path, pki: Certs, *, cert_login: bool) -> RunningBroker:
    return RunningBroker(
        tmp_path / "data",
        tls_cert=str(pki.server.cert),
        tls_key=str(pki.server.key),
        tls_verify_peer=True,
        tls_ca_cert=str(pki.ca.cert),
        mqtts_port=0,
        mqtt_ssl_cert_login=cert_login,
    )


@pytest.fixture
def broker(tmp_path: Path, pki: Certs) -> Iterator[RunningBroker]:
    running = cert_broker(tmp_path, pki, cert_login=True)
    yield running
    running.stop()


def tls_paho(
    broker: RunningBroker, pki: Certs, cert: certs.Pair, client_id: str, **settings: object
) -> Paho:
    settings.setdefault("username", None)
    client = Paho(port_of(broker, "mqtt/ssl"), client_id, **settings)  # type: ignore[arg-type]
    client.client.tls_set_context(client_context(pki.ca, cert))
    client.client.tls_insecure_set(True)  # 127.0.0.1 is not the server certificate's name
    return client


def listing(broker: RunningBroker) -> list[dict[str, object]]:
    status, connections, _ = broker.http("GET", "/api/connections")
    assert status == 200 and isinstance(connections, list)
    return [
        {
            "client_id": c["client_properties"]["client_id"],
            "login": (c["user"], c["auth_mechanism"], c["vhost"]),
            "peer_cert_subject": c["peer_cert_subject"],
        }
        for c in connections
    ]


def test_the_certificates_cn_is_the_user(broker: RunningBroker, pki: Certs) -> None:
    assert broker.http("PUT", "/api/users/alice", {"password_hash": "", "tags": ""})[0] == 201
    grant = {"configure": "^mqtt-subscription-alice", "write": ".*", "read": ".*"}
    assert broker.http("PUT", "/api/permissions/%2F/alice", grant)[0] == 201
    for version in ("3.1.1", "5.0"):
        alice = tls_paho(broker, pki, pki.client_alice, f"alice-{version}", version=version)
        assert alice.connect() == (False, 0)
        assert alice.subscribe("certs/#", 1) == [1]
        alice.publish("certs/a", version.encode(), 1)
        [message] = alice.receive(1)
        assert message.payload == version.encode()
        [listed] = [c for c in listing(broker) if c["client_id"] == f"alice-{version}"]
        assert listed["login"] == ("alice", "EXTERNAL", "/")
        assert listed["peer_cert_subject"] == "CN=alice"
        alice.disconnect()
    # alice's permissions apply: no queue of another name may be declared.
    other = tls_paho(broker, pki, pki.client_alice, "bob-queue")
    assert other.connect() == (False, 0)
    assert other.subscribe("x", 1) == [0x80]
    other.disconnect()


def test_refusals(broker: RunningBroker, pki: Certs) -> None:
    unknown = tls_paho(broker, pki, pki.client_unknown, "nobody")  # CN=nobody: no such user
    assert unknown.connect() == (False, BAD_CREDENTIALS_V5)
    unknown.stop()
    v5 = tls_paho(broker, pki, pki.client_unknown, "nobody-5", version="5.0")
    assert v5.connect() == (False, BAD_CREDENTIALS_V5)
    v5.stop()
    # Credentials given: they are checked, whatever the certificate says.
    wrong = tls_paho(broker, pki, pki.client_guest, "wrong", username="guest", password="no")
    assert wrong.connect() == (False, BAD_CREDENTIALS_V5)
    wrong.stop()
    right = tls_paho(broker, pki, pki.client_alice, "right", username="guest", password="guest")
    assert right.connect() == (False, 0)
    assert [c["login"] for c in listing(broker)] == [("guest", "PLAIN", "/")]
    right.disconnect()


def test_off_by_default(tmp_path: Path, pki: Certs) -> None:
    running = cert_broker(tmp_path, pki, cert_login=False)
    try:
        guest = tls_paho(running, pki, pki.client_guest, "guest-cert")
        assert guest.connect() == (False, BAD_CREDENTIALS_V5)
        guest.stop()
    finally:
        running.stop()
