"""Fixtures of the differential tests: one RabbitMQ and one streamq for the whole session
(each scenario names its own entities). LavinMQ is compared by `report.py`, by hand,
where it is built (docs/compatibility.md)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.differential.peers import Endpoint, RabbitMQServer
from tests.integration.conftest import RunningBroker


@pytest.fixture(scope="session")
def rabbitmq(rabbitmq_links: RabbitMQServer) -> Endpoint:
    """The session's RabbitMQ (tests/conftest.py); its plugins change no AMQP behaviour."""
    return rabbitmq_links.endpoint


@pytest.fixture(scope="session")
def streamq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoint]:
    running = RunningBroker(tmp_path_factory.mktemp("streamq") / "data")
    yield Endpoint("streamq", running.amqp_port, running.http_port)
    running.stop()
