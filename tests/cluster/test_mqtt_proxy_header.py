"""The MQTT listener of a cluster leader: PROXY headers from its followers only
(mqtt_gateway/proxy.py `OptionalProxyHeaderReceiver`, as the AMQP listener's).

Method: the broker runs in-process as a leader would (`run_broker(cluster=...)`),
trusting 127.0.0.2 only, with its MQTT listener on a port from the OS; raw sockets bound
to 127.0.0.2 (a follower) or 127.0.0.1 (anyone else) send a header, or none, then an MQTT
CONNECT through our codec. A follower's header names the client the leader lists; plain
MQTT is served from anyone; a header from anyone else closes the connection."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvloop

from mqtt_gateway.codec import ConnAck, Connect, ProtocolLevel
from streamq.app import ClusterRole, ServeConfig, lock_data_dir, run_broker
from streamq.broker.broker import Broker
from streamq.proxy_receiver import starts_with_header
from tests.integration.conftest import RunningBroker
from tests.mqtt.clients import WAIT_S, RawClient

FOLLOWER_IP = "127.0.0.2"
LEVEL = ProtocolLevel.MQTT_3_1_1


class MqttLeaderBroker(RunningBroker):
    """A leader's broker: data directory locked beforehand, PROXY headers trusted from
    FOLLOWER_IP, MQTT on a port from the OS."""

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

            config = ServeConfig(str(self.data_dir), "127.0.0.1", 0, 0, stream_port=-1, mqtt_port=0)
            role = ClusterRole(trusted_proxy=lambda ip: ip == FOLLOWER_IP, failover=False)
            await run_broker(config, self._stop, ready, keep, cluster=role)

        lock_fd = lock_data_dir(str(self.data_dir))
        try:
            uvloop.run(main())
        except BaseException as exc:
            self.error = exc
            self._ready.set()
        finally:
            os.close(lock_fd)


@pytest.fixture
def leader(tmp_path: Path) -> Iterator[MqttLeaderBroker]:
    running = MqttLeaderBroker(tmp_path / "data")
    yield running
    running.stop()


def dial(broker: RunningBroker, source: str, header: bytes = b"") -> RawClient:
    port = next(p for name, _h, p in broker.listeners if name == "mqtt")
    sock = socket.create_connection(("127.0.0.1", port), WAIT_S, source_address=(source, 0))
    sock.sendall(header)
    client = RawClient(0, LEVEL, sock)
    client.send(Connect(LEVEL, f"from-{source}", username="guest", password=b"guest"))
    return client


def peers(broker: RunningBroker) -> list[tuple[str, int]]:
    status, listed, _ = broker.http("GET", "/api/connections")
    assert status == 200 and isinstance(listed, list)
    return [(c["peer_host"], c["peer_port"]) for c in listed]


@pytest.mark.parametrize(
    ("data", "expected"),
    [(b"", None), (b"P", None), (b"PROXY ", True), (b"\x10", False), (b"\r\n\r\nX", False)],
)
def test_starts_with_header(data: bytes, expected: bool | None) -> None:
    assert starts_with_header(data) is expected


def test_a_followers_header_names_the_client(leader: RunningBroker) -> None:
    header = b"PROXY TCP4 127.9.8.7 127.0.0.1 40001 1883\r\n"
    client = dial(leader, FOLLOWER_IP, header)
    assert client.read() == ConnAck()
    assert peers(leader) == [("127.9.8.7", 40001)]
    client.close()


def test_plain_mqtt_from_anyone(leader: RunningBroker) -> None:
    for source in ("127.0.0.1", FOLLOWER_IP):
        client = dial(leader, source)
        assert client.read() == ConnAck()
        client.close()


def test_a_header_from_anyone_else_is_refused(leader: RunningBroker) -> None:
    spoofing = dial(leader, "127.0.0.1", b"PROXY TCP4 127.9.8.7 127.0.0.1 1 1883\r\n")
    assert spoofing.closed_by_peer()
    assert peers(leader) == []
