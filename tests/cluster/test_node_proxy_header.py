"""The AMQP listener of a cluster leader: PROXY headers from its followers only.

Goal: a follower forwards its clients with a PROXY v1 header naming them, and the leader
shows them with that address; anyone else is plain AMQP, and a header from them is
refused (a client must not claim another's address). Method: the broker runs in-process
as a leader would (`run_broker(cluster=ClusterRole(...))`) trusting 127.0.0.2 only; the
"follower" is a relay whose sockets are bound to 127.0.0.2, the others come from
127.0.0.1. `starts_with_header`, the byte-level decision, is checked on its own too.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path

import pika
import pytest
import uvloop

from streamq.app import ClusterRole, ServeConfig, lock_data_dir, run_broker
from streamq.broker.broker import Broker
from streamq.proxy_protocol import V2_SIGNATURE
from streamq.proxy_receiver import starts_with_header
from tests.integration.conftest import RunningBroker
from tests.integration.test_publish_runs import TIMEOUT_S
from tests.integration.test_transports import (
    connections,
    pika_connect,
    relay,
    round_trip,
    v1_header,
    v2_header,
    wait_for,
)

FOLLOWER_IP = "127.0.0.2"


class LeaderBroker(RunningBroker):
    """RunningBroker as a cluster node runs its leader: the data directory locked by the
    node beforehand, PROXY headers trusted from FOLLOWER_IP."""

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()

            def ready(amqp_port: int, http_port: int) -> None:
                self.amqp_port, self.http_port = amqp_port, http_port
                if self.broker is not None:
                    self.listeners = list(self.broker.listeners)
                self._ready.set()

            def keep(broker: Broker) -> None:
                self.broker = broker

            config = ServeConfig(
                str(self.data_dir), "127.0.0.1", 0, 0, stream_port=-1, mqtt_port=-1
            )
            role = ClusterRole(trusted_proxy=lambda ip: ip == FOLLOWER_IP, failover=False)
            await run_broker(config, self._stop, ready, keep, cluster=role)

        lock_fd = lock_data_dir(str(self.data_dir))  # what the node holds all along
        try:
            uvloop.run(main())
        except BaseException as exc:
            self.error = exc
            self._ready.set()
        finally:
            os.close(lock_fd)


def from_ip(port: int, source: str) -> Callable[[], socket.socket]:
    return lambda: socket.create_connection(
        ("127.0.0.1", port), timeout=TIMEOUT_S, source_address=(source, 0)
    )


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", None),
        (b"P", None),
        (b"PROXY", None),
        (b"PROXY ", True),
        (b"PROXY TCP4 1.2.3.4", True),
        (V2_SIGNATURE[:5], None),
        (V2_SIGNATURE, True),
        (b"AMQP\x00\x00\x09\x01", False),
        (b"A", False),
        (b"PRX", False),
        (b"\r\n\r\nX", False),
    ],
)
def test_starts_with_header(data: bytes, expected: bool | None) -> None:
    assert starts_with_header(data) is expected
    assert starts_with_header(bytearray(data)) is expected


@pytest.mark.parametrize("version", [1, 2])
def test_a_follower_forwards_a_client_with_its_address(tmp_path: Path, version: int) -> None:
    broker = LeaderBroker(tmp_path / "data")
    header = (v1_header if version == 1 else v2_header)("127.9.8.7", 40001)
    try:
        with (
            relay(from_ip(broker.amqp_port, FOLLOWER_IP), header) as follower,
            pika_connect(follower.port) as connection,
        ):
            round_trip(connection)
            [listed] = connections(broker)
            assert (listed["peer_host"], listed["peer_port"]) == ("127.9.8.7", 40001)
    finally:
        broker.stop()


def test_plain_clients_are_served_from_anywhere(tmp_path: Path) -> None:
    broker = LeaderBroker(tmp_path / "data")
    try:
        with pika_connect(broker.amqp_port) as direct:  # from 127.0.0.1, no header
            round_trip(direct)
        with (
            relay(from_ip(broker.amqp_port, FOLLOWER_IP)) as follower,  # trusted, no header
            pika_connect(follower.port) as connection,
        ):
            round_trip(connection)
            [listed] = connections(broker)
            assert listed["peer_host"] == FOLLOWER_IP
    finally:
        broker.stop()


def test_a_header_from_an_untrusted_peer_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broker = LeaderBroker(tmp_path / "data")
    try:
        with caplog.at_level(logging.WARNING, logger="amqp_gateway.listeners"):
            spoofing = relay(from_ip(broker.amqp_port, "127.0.0.1"), v1_header("127.9.8.7", 1))
            with spoofing as through, pytest.raises(pika.exceptions.AMQPConnectionError):
                pika_connect(through.port)
            wait_for(lambda: "not a follower" in caplog.text)
        assert "closing AMQP connection from 127.0.0.1:" in caplog.text
        assert connections(broker) == []
        with pika_connect(broker.amqp_port) as direct:  # the broker goes on
            round_trip(direct)
    finally:
        broker.stop()
