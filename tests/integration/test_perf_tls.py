"""`streamq perf` over AMQPS: amqps:// URIs with RabbitMQ's `cacertfile` and `verify`
query parameters, against the in-process broker's TLS port and its test certificates.
Counts are checked exactly; rates never."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import RunningBroker
from tests.integration.test_perf import assert_one_line_error, perf, summary
from tests.integration.tls_setup import Certs, pki, port_of, tls_broker

__all__ = ["pki"]  # a fixture, used by name


@pytest.fixture
def broker(tmp_path: Path, pki: Certs) -> Iterator[RunningBroker]:
    running = tls_broker(tmp_path, pki.server)
    yield running
    running.stop()


def amqps(port: int, query: str) -> str:
    return f"amqps://guest:guest@127.0.0.1:{port}/%2f?{query}"


def test_throughput_over_tls_counts_are_exact(broker: RunningBroker, pki: Certs) -> None:
    uri = amqps(port_of(broker, "amqp/ssl"), f"cacertfile={pki.ca.cert}")
    result = perf(
        "throughput", "--uri", uri, "-C", "3000", "-D", "3000", "-c", "100", "-a", "10",
        "-P", "100", "-s", "2000", "-j", "-u", "perf-tls",
    )  # fmt: skip
    counts = summary(result)
    assert (counts["published"], counts["confirmed"], counts["consumed"]) == (3000, 3000, 3000)


def test_connections_over_tls_without_verification(broker: RunningBroker) -> None:
    uri = amqps(port_of(broker, "amqp/ssl"), "verify=verify_none")
    assert summary(perf("connections", "3", "--uri", uri, "-j"))["connections"] == 3


def test_untrusted_server_is_one_line(broker: RunningBroker) -> None:
    port = port_of(broker, "amqp/ssl")
    result = perf("connections", "1", "--uri", f"amqps://127.0.0.1:{port}/")
    assert_one_line_error(result, f"TLS handshake with 127.0.0.1:{port} failed")
    assert "certificate verify failed" in result.stderr


def test_bad_tls_uris_are_one_line(tmp_path: Path) -> None:
    for uri, text in [
        ("amqps://127.0.0.1:1/?heartbeat=5", "unsupported query parameter 'heartbeat'"),
        ("amqps://127.0.0.1:1/?verify=maybe", "verify must be verify_peer or verify_none"),
        ("amqp://127.0.0.1:1/?cacertfile=x", "TLS parameters need amqps://"),
    ]:
        assert_one_line_error(perf("connections", "1", "--uri", uri), text)
