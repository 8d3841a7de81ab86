"""Fixtures shared by every test directory, and the hooks that spread the suite over
pytest-xdist's workers (tests/parallel.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from xdist.remote import Producer

from tests.differential.peers import LINK_PLUGINS, RabbitMQServer
from tests.parallel import DurationRecorder, FileGroupScheduling, mark_groups


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mark_groups(config, items)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> FileGroupScheduling | None:
    """pyproject's `--dist loadfile`: units of a file or a group, longest first; another
    `--dist` given on the command line is xdist's own."""
    return FileGroupScheduling(config, log) if config.getvalue("dist") == "loadfile" else None


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller (or a serial run) only
        config.pluginmanager.register(DurationRecorder(config), "streamq-unit-durations")


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
