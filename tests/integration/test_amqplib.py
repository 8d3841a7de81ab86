"""amqplib, the Node.js client, against the broker: an unmodified client of another
language (the issue lists it beside pika, aio-pika and kombu). `npm ci` installs the
pinned version from package-lock.json into tests/integration/amqplib/node_modules."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.integration.conftest import RunningBroker

CLIENT_DIR = Path(__file__).parent / "amqplib"
TIMEOUT_S = 120


@pytest.fixture(scope="module")
def node_client() -> Path:
    node, npm = shutil.which("node"), shutil.which("npm")
    assert node and npm, "Node.js and npm are part of the development machine (docs: env)"
    if not (CLIENT_DIR / "node_modules" / "amqplib").is_dir():
        subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"],
            cwd=CLIENT_DIR,
            check=True,
            timeout=TIMEOUT_S,
            capture_output=True,
        )
    return CLIENT_DIR / "client.js"


def test_amqplib_confirms_topic_prefetch_returns_and_errors(
    broker: RunningBroker, node_client: Path
) -> None:
    done = subprocess.run(
        ["node", str(node_client), str(broker.amqp_port)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["bodies"] == [f"m{n}" for n in range(50)]
    assert result["headers"] == list(range(50))
    assert result["returned"] == [312]
    assert result["errorCode"] == 404
