"""What real stream clients trip over (issue 29, item 7), with the clients that showed it:
rstream and RabbitMQ's stream client for Node.js (rabbitmq-stream-js-client, installed
by `npm ci` from tests/stream/node/package-lock.json, driven by node/stream_client.js).

- A new publisher reference's publishing id 0 is stored (it was dropped as a duplicate).
- A connection closed from the management API ends without a Close frame, which the
  clients expect only as a reply: each sees its connection closed at once, no error.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import subprocess
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from rstream import OffsetType, OnClosedErrorInfo

from tests.integration.conftest import RunningBroker
from tests.stream.conftest import Clients, send_confirmed, stream_port, subscribe
from tests.stream.test_rstream_publish import query_sequence, with_id

NODE_DIR = Path(__file__).parent / "node"
NODE_TIMEOUT_S = 60
NPM_TIMEOUT_S = 180
# A client must see the management API's close well before the broker's own bound
# (stream_gateway.session.CLOSE_TIMEOUT_S, 3 s), which ended the connection of a client
# that could not answer a server's Close.
CLOSE_SEEN_S = 2.0
LIST_TIMEOUT_S = 5.0


@pytest.fixture(scope="module")
def node_client() -> Path:
    node, npm = shutil.which("node"), shutil.which("npm")
    assert node and npm, "Node.js and npm are part of the development machine (docs: env)"
    if not (NODE_DIR / "node_modules" / "rabbitmq-stream-js-client").is_dir():
        subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"],
            cwd=NODE_DIR,
            check=True,
            timeout=NPM_TIMEOUT_S,
            capture_output=True,
        )
    return NODE_DIR / "stream_client.js"


def run_node(script: Path, *args: str) -> dict[str, object]:
    done = subprocess.run(
        ["node", str(script), *args],
        capture_output=True,
        text=True,
        timeout=NODE_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


# -- publishing id 0 of a new reference ---------------------------------------------------


async def test_rstream_ids_0_1_2_of_a_new_reference_are_all_stored(clients: Clients) -> None:
    sender = await clients.producer()
    await sender.create_stream("zero")
    assert await query_sequence(sender, "zero", "fresh") == 0  # unknown: 0, as RabbitMQ
    messages = [with_id(b"m%d" % n, n) for n in range(3)]
    statuses = await send_confirmed(sender, "zero", messages, publisher_name="fresh")
    assert sorted(status.message_id for status in statuses) == [0, 1, 2]
    assert all(status.is_confirmed for status in statuses)
    assert await query_sequence(sender, "zero", "fresh") == 2
    # Id 0 again is now a duplicate: confirmed, not stored.
    again = await send_confirmed(sender, "zero", [with_id(b"dup", 0)], publisher_name="fresh")
    assert again[0].is_confirmed
    received = await subscribe(await clients.consumer(), "zero", OffsetType.FIRST)
    await received.wait(3)
    assert (await received.quiet()) and received.bodies() == [b"m0", b"m1", b"m2"]


def test_node_stream_client_ids_0_1_2_of_a_new_reference_are_all_stored(
    broker: RunningBroker, node_client: Path
) -> None:
    result = run_node(node_client, "dedup", str(stream_port(broker)), "node-zero")
    assert result == {"confirmed": [0, 1, 2], "sequence": 2, "stored": ["m0", "m1", "m2"]}


# -- closed from the management API -------------------------------------------------------


def close_stream_connections(broker: RunningBroker) -> int:
    """DELETE every stream connection the management API lists; how many."""
    deadline = time.monotonic() + LIST_TIMEOUT_S
    while True:
        status, listed, _ = broker.http("GET", "/api/connections")
        assert status == 200 and isinstance(listed, list)
        names = [item["name"] for item in listed if item["protocol"] == "RabbitMQ Stream"]
        if names or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for name in names:
        quoted = urllib.parse.quote(name, safe="")
        assert broker.http("DELETE", f"/api/connections/{quoted}")[0] == 204
    return len(names)


async def test_rstream_sees_a_management_close_at_once(
    broker: RunningBroker, clients: Clients, caplog: pytest.LogCaptureFixture
) -> None:
    closed = asyncio.Event()
    reasons: list[str] = []

    def on_close(info: OnClosedErrorInfo) -> None:
        reasons.append(info.reason)
        closed.set()

    sender = await clients.producer(on_close_handler=on_close)
    await sender.create_stream("closed")
    await send_confirmed(sender, "closed", [b"before"])
    caplog.set_level(logging.WARNING, logger="rstream")
    assert await asyncio.to_thread(close_stream_connections, broker) >= 1
    await asyncio.wait_for(closed.wait(), CLOSE_SEEN_S)
    assert reasons[0] == "Connection Closed"
    assert not [r for r in caplog.records if "Error while running handler" in r.getMessage()]


def test_node_stream_client_sees_a_management_close_at_once(
    broker: RunningBroker, node_client: Path
) -> None:
    process = subprocess.Popen(
        ["node", str(node_client), "closed", str(stream_port(broker)), "node-closed"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        with ThreadPoolExecutor(1) as pool:
            ready = pool.submit(process.stdout.readline).result(NODE_TIMEOUT_S)
        assert ready.strip() == "ready", process.stderr.read() if process.stderr else ""
        started = time.monotonic()
        assert close_stream_connections(broker) >= 1
        out, err = process.communicate(timeout=NODE_TIMEOUT_S)
        elapsed = time.monotonic() - started
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(NODE_TIMEOUT_S)
    assert process.returncode == 0, err
    result = json.loads(out.splitlines()[-1])
    assert result == {"outcome": "connection_closed hadError=false", "errors": []}
    assert elapsed < CLOSE_SEEN_S
