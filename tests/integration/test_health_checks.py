"""RabbitMQ's health checks (`/api/health/checks/...`) on a real broker: each check answers
200 while all is well and 503 with RabbitMQ's reason and fields once the state it checks
goes wrong (an alarm raised, a vhost that could not be opened, a port or protocol not
served, a certificate expiring within the window), and 400 for a path argument RabbitMQ
refuses. The differential scenario (tests/differential/scenarios/health_checks.py)
compares the same answers with a real RabbitMQ where it can be brought to the same state.
"""

from __future__ import annotations

import hashlib
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamq.broker.node_names import node_name
from streamq.broker.resources import ResourceLimits
from tests.integration import certs
from tests.integration.conftest import RunningBroker, broker_on
from tests.integration.tls_setup import Certs, pki, port_of, tls_broker
from tests.small_fs import fill, small_filesystem

__all__ = ["pki"]  # a fixture, used by name

TERABYTE = 1 << 40
CHECKS = "/api/health/checks"


def get(broker: RunningBroker, check: str) -> tuple[int, object]:
    status, body, _ = broker.http("GET", f"{CHECKS}/{check}")
    return status, body


def test_every_check_passes_on_a_healthy_broker(broker: RunningBroker) -> None:
    for check in ("alarms", "local-alarms", "virtual-hosts", "certificate-expiration/1/days"):
        assert get(broker, check) == (200, {"status": "ok"}), check
    assert get(broker, "node-is-quorum-critical") == (
        200,
        {"status": "ok", "reason": "single node cluster"},
    )
    assert get(broker, f"port-listener/{broker.amqp_port}") == (
        200,
        {"status": "ok", "port": broker.amqp_port},
    )
    assert get(broker, "protocol-listener/amqp") == (200, {"status": "ok", "protocol": "amqp"})


def test_the_memory_alarm_fails_both_alarm_checks_until_it_clears(tmp_path: Path) -> None:
    with broker_on(tmp_path / "data", ResourceLimits(1, 0)) as running:  # 1 byte: alarm on
        alarm = [{"resource": "memory", "node": node_name()}]
        assert get(running, "alarms") == (
            503,
            {
                "status": "failed",
                "reason": "There are alarms in effect in the cluster",
                "alarms": alarm,
            },
        )
        assert get(running, "local-alarms") == (
            503,
            {
                "status": "failed",
                "reason": "There are alarms in effect on the node",
                "alarms": alarm,
            },
        )

        def clear() -> None:
            assert running.broker is not None
            running.broker.resources.limits = ResourceLimits(TERABYTE, 0)

        running.call(clear)
        deadline = time.monotonic() + 10
        while get(running, "alarms")[0] != 200:
            assert time.monotonic() < deadline, "the alarm check did not clear"
        assert get(running, "local-alarms") == (200, {"status": "ok"})


def test_the_disk_alarm_is_named_as_rabbitmq_names_it(tmp_path: Path) -> None:
    # A free-disk limit of a petabyte: no test machine has that much free.
    with broker_on(tmp_path / "data", ResourceLimits(TERABYTE, TERABYTE * 1024)) as running:
        status, body = get(running, "local-alarms")
        assert status == 503
        assert isinstance(body, dict)
        assert body["alarms"] == [{"resource": "disk space", "node": node_name()}]


def test_a_full_file_system_raises_the_disk_alarm_until_room_returns(tmp_path: Path) -> None:
    # The data directory on a small tmpfs, filled to below the 1 MiB free-disk limit.
    with small_filesystem(tmp_path / "fs", "32m") as fs:
        limits = ResourceLimits(TERABYTE, 1 << 20)
        with broker_on(fs / "data", limits) as running:
            assert get(running, "alarms") == (200, {"status": "ok"})
            filler = fill(fs / "filler", 256 * 1024)
            status, body = get(running, "alarms")
            assert (status, body) == (
                503,
                {
                    "status": "failed",
                    "reason": "There are alarms in effect in the cluster",
                    "alarms": [{"resource": "disk space", "node": node_name()}],
                },
            )
            filler.unlink()
            assert get(running, "alarms") == (200, {"status": "ok"})


def test_a_vhost_that_cannot_be_opened_is_down(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with broker_on(data) as running:
        assert running.http("PUT", "/api/vhosts/broken")[0] == 201
    # Its directory replaced by a file: the restart cannot open the vhost, the rest runs.
    directory = data / "vhosts" / hashlib.sha1(b"broken").hexdigest()
    assert directory.is_dir()
    shutil.rmtree(directory)
    directory.write_bytes(b"not a directory")
    with broker_on(data) as running:
        assert get(running, "virtual-hosts") == (
            503,
            {
                "status": "failed",
                "reason": "Some virtual hosts are down",
                "virtual-hosts": ["broken"],
            },
        )


def test_port_listener_answers_for_bound_ports_only(tmp_path: Path) -> None:
    socket_path = tmp_path / "amqp.sock"
    running = RunningBroker(tmp_path / "data", stream_port=0, amqp_unix_path=str(socket_path))
    try:
        ports = [running.amqp_port, running.http_port, running.stream_port]
        for port in ports:
            assert get(running, f"port-listener/{port}") == (200, {"status": "ok", "port": port})
        # The unix socket has no port: port 0 is no listener.
        assert get(running, "port-listener/0") == (
            503,
            {"status": "failed", "reason": "No active listener", "missing": 0, "ports": ports},
        )
        for bad in ("amqp", "1.5", "5672x", "%205672"):
            assert get(running, f"port-listener/{bad}") == (
                400,
                {"error": "bad_request", "reason": "Invalid port"},
            ), bad
    finally:
        running.stop()


def test_protocol_listener_takes_rabbitmqs_names_and_aliases(tmp_path: Path, pki: Certs) -> None:
    running = tls_broker(tmp_path, pki.server, stream_port=0, streams_port=0)
    try:
        for asked, protocol in (
            ("amqp", "amqp"),
            ("AMQP0-9-1", "amqp"),
            ("amqps", "amqp/ssl"),
            ("amqp%2Fssl", "amqp/ssl"),
            ("http", "http"),
            ("management", "http"),
            ("https", "https"),
            ("stream", "stream"),
            ("stream%2Fssl", "stream/ssl"),
        ):
            assert get(running, f"protocol-listener/{asked}") == (
                200,
                {"status": "ok", "protocol": protocol},
            ), asked
        status, body = get(running, "protocol-listener/mqtt3.1.1")
        assert status == 503
        assert isinstance(body, dict)
        assert (body["reason"], body["missing"]) == ("No active listener", "mqtt")
        assert sorted(body["protocols"]) == sorted(
            ["amqp", "http", "amqp/ssl", "https", "stream", "stream/ssl"]
        )
    finally:
        running.stop()


@pytest.fixture
def short_lived(tmp_path: Path, pki: Certs) -> Iterator[tuple[RunningBroker, certs.Pair]]:
    """A broker whose server certificate expires in 10 days (its CA in a year)."""
    pair = certs.issue(tmp_path, pki.ca, "ten-days", days=10)
    running = tls_broker(tmp_path, pair, tls_ca_cert=str(pki.ca.cert), stream_port=0)
    yield running, pair
    running.stop()


def test_certificate_expiration_lists_each_tls_listener_expiring(
    short_lived: tuple[RunningBroker, certs.Pair], pki: Certs
) -> None:
    running, pair = short_lived
    assert get(running, "certificate-expiration/1/weeks") == (200, {"status": "ok"})
    status, body = get(running, "certificate-expiration/2/WEEKS")
    assert status == 503
    assert isinstance(body, dict)
    assert (body["status"], body["reason"]) == ("failed", "Certificates expiring")
    expired = body["expired"]
    assert isinstance(expired, list)
    tls_ports = {port_of(running, "amqp/ssl"), port_of(running, "https")}
    assert {(e["protocol"], e["port"]) for e in expired} == {
        ("amqp/ssl", port_of(running, "amqp/ssl")),
        ("https", port_of(running, "https")),
    }
    in_ten_days = time.gmtime(time.time() + 10 * 86400)
    for entry in expired:
        assert entry["port"] in tls_ports
        assert entry["node"] == node_name()
        assert entry["interface"] == "127.0.0.1"
        assert (entry["certfile"], entry["cacertfile"]) == (str(pair.cert), str(pki.ca.cert))
        assert entry["cacertfile_expires_on"] == []  # the CA lasts a year
        (date,) = entry["certfile_expires_on"]
        assert date.startswith(time.strftime("%Y-%m-%d", in_ten_days)), date
    # Within two years the CA expires too.
    status, body = get(running, "certificate-expiration/2/years")
    assert status == 503
    assert isinstance(body, dict)
    assert all(len(e["cacertfile_expires_on"]) == 1 for e in body["expired"])
    # A month is a twelfth of 365 days, as in RabbitMQ: 10 days fit in one.
    assert get(running, "certificate-expiration/1/months")[0] == 503


def test_certificate_expiration_refuses_what_rabbitmq_refuses(broker: RunningBroker) -> None:
    for path, reason in (
        ("1/fortnights", "Time unit not recognised. Supported units: days, weeks, months, years."),
        ("x/days", "Invalid expiration value."),
        ("1.5/days", "Invalid expiration value."),
    ):
        assert get(broker, f"certificate-expiration/{path}") == (
            400,
            {"error": "bad_request", "reason": reason},
        ), path


def test_checks_need_a_management_user(broker: RunningBroker) -> None:
    status, _, _ = broker.http("GET", f"{CHECKS}/alarms", password="wrong")
    assert status == 401
    assert broker.http("PUT", "/api/users/plain", {"password": "plain", "tags": ""})[0] == 201
    status, body, _ = broker.http("GET", f"{CHECKS}/alarms", user="plain", password="plain")
    assert (status, body) == (401, {"error": "not_authorised", "reason": "Not management user"})
