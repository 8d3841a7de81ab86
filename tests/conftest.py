"""Fixtures shared by every test directory."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.differential.peers import LINK_PLUGINS, RabbitMQServer


@pytest.fixture(scope="session")
def rabbitmq_links(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitMQServer]:
    """One RabbitMQ node, with the shovel and federation plugins, for every module that
    interoperates with RabbitMQ (each names its own entities): a node costs about 15 s
    to start and stop."""
    server = RabbitMQServer(tmp_path_factory.mktemp("rabbitmq-links"), plugins=LINK_PLUGINS)
    try:
        yield server
    finally:
        server.stop()
