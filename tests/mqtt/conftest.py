"""The broker of the MQTT gateway's tests: in-process on loopback with the MQTT listener
on a port from the OS (tests/integration/conftest.py's RunningBroker)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import RunningBroker


def mqtt_port(running: RunningBroker) -> int:
    return next(port for name, _host, port in running.listeners if name == "mqtt")


class MqttBroker(RunningBroker):
    """A RunningBroker with its MQTT listener on; `mqtt_port` once it runs."""

    def __init__(self, data_dir: Path, **settings: object) -> None:
        settings.setdefault("mqtt_port", 0)
        super().__init__(data_dir, **settings)
        self.mqtt_port = mqtt_port(self)


@pytest.fixture
def mqtt_broker(tmp_path: Path) -> Iterator[MqttBroker]:
    running = MqttBroker(tmp_path / "data")
    yield running
    running.stop()
