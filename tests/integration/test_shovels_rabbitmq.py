"""Shovels between streamq and a real RabbitMQ, both ways, and RabbitMQ's own shovel
plugin moving messages into streamq: the same parameter values work on both brokers.

RabbitMQ is Debian's rabbitmq-server with the shovel plugins, started by this module on
free loopback ports with a directory of its own (tests/differential/peers.py), and stopped
by its pid at the end.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from tests.differential.peers import RabbitMQServer
from tests.integration.conftest import RunningBroker
from tests.integration.shovel_helpers import (
    amqp_uri,
    bodies_of,
    connect,
    http_call,
    numbered,
    publish,
    put_shovel,
    queue_messages,
    take_all,
    wait_length,
    wait_state,
    wait_until,
)


@pytest.fixture
def rabbitmq(rabbitmq_links: RabbitMQServer) -> RabbitMQServer:
    """The session's RabbitMQ (tests/integration/conftest.py)."""
    return rabbitmq_links


@pytest.fixture
def streamq(tmp_path: Path) -> Iterator[RunningBroker]:
    running = RunningBroker(tmp_path / "data")
    yield running
    running.stop()


def test_streamq_shovels_from_rabbitmq(rabbitmq: RabbitMQServer, streamq: RunningBroker) -> None:
    props = pika.BasicProperties(delivery_mode=2, headers={"origin": "rabbit"})
    publish(rabbitmq.amqp_port, "from-rabbit", numbered(300), props)
    value = {
        "src-uri": amqp_uri(rabbitmq.amqp_port),
        "src-queue": "from-rabbit",
        "dest-uri": "amqp://",
        "dest-queue": "arrived",
        "dest-add-forward-headers": True,
    }
    put_shovel(streamq.http_port, "in", value)
    wait_length(streamq.amqp_port, "arrived", 300)
    connection = connect(streamq.amqp_port)
    got = take_all(connection.channel(), "arrived")
    connection.close()
    assert [body for _, body in got] == numbered(300)
    headers = got[0][0].headers
    assert headers["origin"] == "rabbit" and headers["x-shovelled"][0]["shovel-name"] == "in"
    wait_until(
        lambda: queue_messages(rabbitmq.http_port, "from-rabbit") == 0, "acked at RabbitMQ", 30
    )
    assert wait_state(streamq.http_port, "in", "running")["transferred"] == 300


def test_streamq_shovels_to_rabbitmq(rabbitmq: RabbitMQServer, streamq: RunningBroker) -> None:
    publish(streamq.amqp_port, "outbound", numbered(300))
    value = {
        "src-uri": "amqp://",
        "src-queue": "outbound",
        "dest-uri": [amqp_uri(1), amqp_uri(rabbitmq.amqp_port)],  # the first one is down
        "dest-queue": "from-streamq",
        "ack-mode": "on-confirm",
    }
    put_shovel(streamq.http_port, "out", value)
    wait_length(rabbitmq.amqp_port, "from-streamq", 300)
    assert bodies_of(rabbitmq.amqp_port, "from-streamq") == numbered(300)
    wait_until(lambda: queue_messages(streamq.http_port, "outbound") == 0, "acked", 30)


def test_rabbitmq_shovel_plugin_moves_into_streamq(
    rabbitmq: RabbitMQServer, streamq: RunningBroker
) -> None:
    """RabbitMQ's own shovel, with the same value keys, publishing to streamq: streamq is
    a destination RabbitMQ's Erlang client is happy with (confirms, declare)."""
    publish(rabbitmq.amqp_port, "plugin-src", numbered(200))
    value = {
        "src-uri": "amqp://",
        "src-queue": "plugin-src",
        "dest-uri": amqp_uri(streamq.amqp_port),
        "dest-queue": "plugin-dst",
        "ack-mode": "on-confirm",
        "src-delete-after": "queue-length",
    }
    put_shovel(rabbitmq.http_port, "plugin", value)
    wait_length(streamq.amqp_port, "plugin-dst", 200, 60)
    assert bodies_of(streamq.amqp_port, "plugin-dst") == numbered(200)
    wait_until(
        lambda: http_call(rabbitmq.http_port, "GET", "/api/parameters/shovel/%2F/plugin")[0] == 404,
        "RabbitMQ deletes its shovel after queue-length",
        60,
    )


def test_refused_login_shows_in_status(rabbitmq: RabbitMQServer, streamq: RunningBroker) -> None:
    value = {
        "src-uri": f"amqp://guest:wrong@127.0.0.1:{rabbitmq.amqp_port}/%2F",
        "src-queue": "never",
        "dest-uri": "amqp://",
        "dest-queue": "never",
        "reconnect-delay": 1,
    }
    put_shovel(streamq.http_port, "refused", value)

    def failed() -> dict[str, object] | None:
        _, shovels = http_call(streamq.http_port, "GET", "/api/shovels/%2F")
        assert isinstance(shovels, list)
        found = [s for s in shovels if s["name"] == "refused" and s["error"]]
        return found[0] if found else None

    status = wait_until(failed, "the refusal in the status")
    assert isinstance(status, dict)
    assert "403" in str(status["error"]) or "refused" in str(status["error"]).lower()
    assert "wrong" not in str(status)  # the password never shows
