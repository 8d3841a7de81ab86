"""amqplib, the Node.js client, against the broker: an unmodified client of another
language (the issue lists it beside pika, aio-pika and kombu). `npm ci` installs the
pinned version from package-lock.json into tests/integration/amqplib/node_modules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.conftest import RunningBroker
from tests.node_clients import installed, run_script

CLIENT_DIR = Path(__file__).parent / "amqplib"
TIMEOUT_S = 120


@pytest.fixture(scope="module")
def node_client() -> Path:
    return installed(CLIENT_DIR, "amqplib") / "client.js"


def test_amqplib_confirms_topic_prefetch_returns_and_errors(
    broker: RunningBroker, node_client: Path
) -> None:
    done = run_script(node_client, str(broker.amqp_port), timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["bodies"] == [f"m{n}" for n in range(50)]
    assert result["headers"] == list(range(50))
    assert result["returned"] == [312]
    assert result["errorCode"] == 404
