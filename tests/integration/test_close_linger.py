"""The end of an AMQP connection as clients need it (issue 29, item 7): after its
close-ok the broker reads and discards until the client hangs up, bounded by
CLOSED_LINGER_S; a connection closed from the management API keeps reading until the
client's close-ok (bounded by CLOSE_TIMEOUT_S). amqplib with publishes queued behind
its close() is the client that showed it (tests/integration/amqplib/close_queued.js)."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

from amqp_gateway import codec
from amqp_gateway.codec import methods as m
from amqp_gateway.session import CLOSED_LINGER_S
from tests.differential.scenarios.client_quirks import AMQPLIB_DIR, amqplib_installed, sends_on
from tests.differential.wire import Closed, Silence, WireClient
from tests.integration.conftest import RunningBroker

NODE_TIMEOUT_S = 60
SLACK_S = 3.0  # scheduling on a loaded machine
LIST_TIMEOUT_S = 5.0


def opened(broker: RunningBroker) -> WireClient:
    client = WireClient("127.0.0.1", broker.amqp_port)
    assert client.handshake()[0][2] == "connection.open-ok"
    client.send(1, m.ChannelOpen())
    assert client.read()[2] == "channel.open-ok"
    return client


def test_amqplib_close_returns_with_publishes_queued(broker: RunningBroker) -> None:
    script = amqplib_installed()
    for round_ in range(3):  # the race between close and the queued frames varies
        done = subprocess.run(
            ["node", str(script), str(broker.amqp_port), f"queued-{round_}"],
            capture_output=True,
            text=True,
            timeout=NODE_TIMEOUT_S,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        assert result["refused"] > 0  # publishes were still queued in amqplib
        assert (result["outcome"], result["errors"]) == ("closed", [])


def test_the_socket_stays_open_after_close_ok_until_the_linger_bound(
    broker: RunningBroker,
) -> None:
    client = opened(broker)
    client.send(0, m.ConnectionClose(reply_code=200, reply_text="bye"))
    assert client.read()[2] == "connection.close-ok"
    started = time.monotonic()
    assert sends_on(client, "nowhere", 1.0) == "open"
    # A client that never hangs up: the broker closes after CLOSED_LINGER_S.
    client.closed = False
    try:
        client.read(CLOSED_LINGER_S + SLACK_S)
        raise AssertionError("a frame after close-ok")
    except Closed:
        pass
    elapsed = time.monotonic() - started
    assert CLOSED_LINGER_S - 0.5 <= elapsed <= CLOSED_LINGER_S + SLACK_S, elapsed
    client.close()


def test_a_client_that_hangs_up_is_gone_at_once(broker: RunningBroker) -> None:
    client = opened(broker)
    client.send(0, m.ConnectionClose(reply_code=200, reply_text="bye"))
    assert client.read()[2] == "connection.close-ok"
    client.close()
    deadline = time.monotonic() + LIST_TIMEOUT_S
    while broker.http("GET", "/api/connections")[1]:
        assert time.monotonic() < deadline, "the connection stayed listed"
        time.sleep(0.05)


def test_management_close_reads_until_close_ok(broker: RunningBroker) -> None:
    client = opened(broker)
    deadline = time.monotonic() + LIST_TIMEOUT_S
    while not (listed := broker.http("GET", "/api/connections")[1]):
        assert time.monotonic() < deadline, "the connection is not listed"
        time.sleep(0.05)
    assert isinstance(listed, list)
    name = urllib.parse.quote(listed[0]["name"], safe="")
    status, _, _ = broker.http("DELETE", f"/api/connections/{name}")
    assert status == 204
    frame_type, channel, payload = client.read_frame(time.monotonic() + LIST_TIMEOUT_S)
    assert (frame_type, channel) == (codec.FRAME_METHOD, 0)
    close = codec.decode_method(payload)
    assert isinstance(close, m.ConnectionClose) and close.reply_code == 320, close
    # Publishes the client had queued before it read the close: discarded, no reset.
    for _ in range(100):
        client.send_content(1, m.BasicPublish(exchange="", routing_key="q"), b"x")
    try:
        client.read(0.5)
        raise AssertionError("a frame before our close-ok")
    except Silence:
        pass
    client.send(0, m.ConnectionCloseOk())
    try:
        client.read(LIST_TIMEOUT_S)
        raise AssertionError("a frame after close-ok")
    except Closed:
        pass  # closed at once after the client's close-ok, as RabbitMQ
    client.close()


def test_amqplib_publishing_sees_a_management_close_cleanly(broker: RunningBroker) -> None:
    """amqplib keeps publishing 64 KiB messages while the management API closes its
    connection: it reads the 320 and ends with no socket error."""
    amqplib_installed()
    process = subprocess.Popen(
        ["node", str(AMQPLIB_DIR / "forced_close.js"), str(broker.amqp_port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        with ThreadPoolExecutor(1) as pool:
            assert pool.submit(process.stdout.readline).result(NODE_TIMEOUT_S).strip() == "ready"
        listed = broker.http("GET", "/api/connections")[1]
        assert isinstance(listed, list) and len(listed) == 1
        name = urllib.parse.quote(listed[0]["name"], safe="")
        assert broker.http("DELETE", f"/api/connections/{name}")[0] == 204
        out, err = process.communicate(timeout=NODE_TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(NODE_TIMEOUT_S)
    assert process.returncode == 0, err
    result = json.loads(out.splitlines()[-1])
    assert result["errors"] == []
    assert "320 (CONNECTION-FORCED)" in result["outcome"], result
