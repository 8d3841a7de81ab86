"""amqp_gateway.endpoints: which peers count as loopback (guest's rule), and the
endpoints of a unix socket's connections."""

from __future__ import annotations

import pytest

from amqp_gateway.endpoints import Endpoints, ip_endpoints, unix_endpoints


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.9.8.7", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),  # a dual-stack listener's view of 127.0.0.1
        ("::ffff:192.0.2.1", False),
        ("192.0.2.1", False),
        ("2001:db8::1", False),
        ("not-an-address", False),
    ],
)
def test_loopback_peers(host: str, loopback: bool) -> None:
    ends = ip_endpoints((host, 1234), ("127.0.0.1", 5672))
    assert ends == Endpoints(host, 1234, "127.0.0.1", 5672, loopback)
    assert ends.peer == f"{host}:1234"


def test_unix_endpoints_are_local_and_numbered() -> None:
    assert unix_endpoints("/run/amqp.sock", 3) == Endpoints("unix", 3, "/run/amqp.sock", 0, True)
