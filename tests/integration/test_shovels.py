"""Dynamic shovels between two streamq brokers (and within one, through `amqp://`),
created through the management API as RabbitMQ's are, driven and checked with pika.

Each test starts real in-process brokers on loopback port 0; the shovel runs in the
broker that holds its parameter, consuming from `src-uri` and publishing to `dest-uri`.
"""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from tests.integration.conftest import RunningBroker
from tests.integration.shovel_helpers import (
    amqp_uri,
    bodies_of,
    connect,
    http_call,
    numbered,
    publish,
    put_shovel,
    queue_length,
    queue_messages,
    shovel_status,
    take_all,
    wait_length,
    wait_state,
    wait_until,
)


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[RunningBroker, RunningBroker]]:
    """Two brokers: the first runs the shovels, the second is a destination."""
    first = RunningBroker(tmp_path / "a")
    try:
        second = RunningBroker(tmp_path / "b")
        try:
            yield first, second
        finally:
            second.stop()
    finally:
        first.stop()


def test_queue_to_queue_between_brokers(pair: tuple[RunningBroker, RunningBroker]) -> None:
    a, b = pair
    publish(a.amqp_port, "src", numbered(500))
    value = {"src-uri": "amqp://", "src-queue": "src", "dest-uri": amqp_uri(b.amqp_port)}
    put_shovel(a.http_port, "move", {**value, "dest-queue": "dst"})
    wait_length(b.amqp_port, "dst", 500)
    assert bodies_of(b.amqp_port, "dst") == numbered(500)  # in order, once each
    wait_until(lambda: queue_messages(a.http_port, "src") == 0, "src acked")
    status = wait_state(a.http_port, "move", "running")
    assert status["transferred"] == 500
    assert status["type"] == "dynamic" and status["src_queue"] == "src"
    assert status["dest_queue"] == "dst"
    assert "guest:guest" not in str(status["dest_uri"])  # the password is redacted
    publish(a.amqp_port, "src", numbered(10, 500))  # it keeps running
    wait_length(b.amqp_port, "dst", 10)
    assert bodies_of(b.amqp_port, "dst") == numbered(10, 500)


def test_local_shovel_and_delete_stops_it(broker: RunningBroker) -> None:
    publish(broker.amqp_port, "src", numbered(20))
    value = {"src-uri": "amqp://", "src-queue": "src", "dest-uri": "amqp://", "dest-queue": "dst"}
    put_shovel(broker.http_port, "local", value)
    wait_length(broker.amqp_port, "dst", 20)
    wait_until(lambda: queue_messages(broker.http_port, "src") == 0, "src acked")
    status, _ = http_call(broker.http_port, "DELETE", "/api/parameters/shovel/%2F/local")
    assert status == 204
    wait_until(lambda: shovel_status(broker.http_port, "local") is None, "shovel gone")
    publish(broker.amqp_port, "src", numbered(5))
    time.sleep(0.5)
    assert queue_length(broker.amqp_port, "src") == 5  # nothing consumes it any more


def test_exchange_to_exchange_with_keys_and_headers(
    pair: tuple[RunningBroker, RunningBroker],
) -> None:
    a, b = pair
    src = connect(a.amqp_port)
    src.channel().exchange_declare("events", "topic", durable=True)
    dst = connect(b.amqp_port)
    channel = dst.channel()
    channel.exchange_declare("copied", "direct", durable=True)
    channel.queue_declare("moved", durable=True)
    channel.queue_bind("moved", "copied", "moved-key")
    value = {
        "src-uri": "amqp://",
        "src-exchange": "events",
        "src-exchange-key": "a.*",
        "dest-uri": amqp_uri(b.amqp_port),
        "dest-exchange": "copied",
        "dest-exchange-key": "moved-key",
        "dest-add-forward-headers": True,
        "dest-add-timestamp-header": True,
    }
    put_shovel(a.http_port, "x2x", value)
    wait_state(a.http_port, "x2x", "running")
    props = pika.BasicProperties(headers={"mine": "kept"}, content_type="text/plain")
    publish(a.amqp_port, "a.one", [b"1"], props, exchange="events", declare=False)
    publish(a.amqp_port, "b.one", [b"2"], props, exchange="events", declare=False)
    publish(a.amqp_port, "a.two", [b"3"], props, exchange="events", declare=False)
    wait_length(b.amqp_port, "moved", 2)
    before_s = int(time.time()) - 5
    got = take_all(channel, "moved")
    assert [body for _, body in got] == [b"1", b"3"]  # b.one does not match a.*
    headers = got[0][0].headers
    assert got[0][0].content_type == "text/plain" and headers["mine"] == "kept"
    (hop,) = headers["x-shovelled"]
    assert hop["shovel-name"] == "x2x" and hop["shovel-vhost"] == "/"
    assert hop["shovel-type"] == "dynamic" and hop["src-exchange"] == "events"
    assert hop["src-exchange-key"] == "a.*" and hop["dest-exchange"] == "copied"
    assert hop["dest-exchange-key"] == "moved-key" and "guest:guest" not in hop["dest-uri"]
    assert before_s <= int(headers["x-shovelled-timestamp"].timestamp()) <= time.time() + 5
    src.close()
    dst.close()


@pytest.mark.parametrize(("after", "moved"), [("queue-length", 50), (20, 20)])
def test_delete_after(broker: RunningBroker, after: object, moved: int) -> None:
    publish(broker.amqp_port, "src", numbered(50))
    value = {
        "src-uri": "amqp://",
        "src-queue": "src",
        "src-delete-after": after,
        "dest-uri": "amqp://",
        "dest-queue": "dst",
    }
    put_shovel(broker.http_port, "once", value)
    wait_until(
        lambda: http_call(broker.http_port, "GET", "/api/parameters/shovel/%2F/once")[0] == 404,
        "the shovel deletes its own parameter",
    )
    wait_until(lambda: shovel_status(broker.http_port, "once") is None, "shovel gone")
    assert bodies_of(broker.amqp_port, "dst") == numbered(moved)
    assert queue_length(broker.amqp_port, "src") == 50 - moved  # the rest stays, unacked none
    publish(broker.amqp_port, "src", numbered(3))
    time.sleep(0.3)
    assert queue_length(broker.amqp_port, "src") == 50 - moved + 3


def test_stream_source_from_first_offset(pair: tuple[RunningBroker, RunningBroker]) -> None:
    a, b = pair
    connection = connect(a.amqp_port)
    channel = connection.channel()
    channel.queue_declare("log", durable=True, arguments={"x-queue-type": "stream"})
    channel.confirm_delivery()
    for body in numbered(30):
        channel.basic_publish("", "log", body)
    connection.close()
    value = {
        "src-uri": "amqp://",
        "src-queue": "log",
        "src-consumer-args": {"x-stream-offset": "first"},
        "dest-uri": amqp_uri(b.amqp_port),
        "dest-queue": "copy",
    }
    put_shovel(a.http_port, "replay", value)
    wait_length(b.amqp_port, "copy", 30)
    assert bodies_of(b.amqp_port, "copy") == numbered(30)


@pytest.mark.parametrize("mode", ["on-publish", "no-ack"])
def test_ack_modes(pair: tuple[RunningBroker, RunningBroker], mode: str) -> None:
    a, b = pair
    publish(a.amqp_port, "src", numbered(300))
    value = {
        "src-uri": "amqp://",
        "src-queue": "src",
        "dest-uri": amqp_uri(b.amqp_port),
        "dest-queue": "dst",
        "ack-mode": mode,
    }
    put_shovel(a.http_port, "mode", value)
    wait_length(b.amqp_port, "dst", 300)
    wait_until(lambda: queue_messages(a.http_port, "src") == 0, "src settled")
    assert bodies_of(b.amqp_port, "dst") == numbered(300)


def test_pause_resume_restart(pair: tuple[RunningBroker, RunningBroker]) -> None:
    a, b = pair
    value = {
        "src-uri": "amqp://",
        "src-queue": "src",
        "dest-uri": amqp_uri(b.amqp_port),
        "dest-queue": "dst",
    }
    put_shovel(a.http_port, "p", value)
    wait_state(a.http_port, "p", "running")
    status, _ = http_call(a.http_port, "PUT", "/api/shovels/vhost/%2F/p/pause")
    assert status in (200, 204)
    wait_state(a.http_port, "p", "paused")
    publish(a.amqp_port, "src", numbered(10))
    time.sleep(0.5)
    assert queue_length(a.amqp_port, "src") == 10  # paused: nothing moves
    status, _ = http_call(a.http_port, "PUT", "/api/shovels/vhost/%2F/p/resume")
    assert status in (200, 204)
    wait_length(b.amqp_port, "dst", 10)
    wait_state(a.http_port, "p", "running")
    # Settled first: a restart redelivers what was confirmed but not yet acked.
    wait_until(lambda: queue_messages(a.http_port, "src") == 0, "src acked")
    status, _ = http_call(a.http_port, "DELETE", "/api/shovels/vhost/%2F/p/restart")
    assert status in (200, 204)
    wait_state(a.http_port, "p", "running")
    publish(a.amqp_port, "src", numbered(5, 10))
    wait_length(b.amqp_port, "dst", 15)
    assert bodies_of(b.amqp_port, "dst") == numbered(15)


def test_broker_restart_resumes_the_shovel(tmp_path: Path) -> None:
    b = RunningBroker(tmp_path / "b")
    try:
        a = RunningBroker(tmp_path / "a")
        value = {
            "src-uri": "amqp://",
            "src-queue": "src",
            "dest-uri": amqp_uri(b.amqp_port),
            "dest-queue": "dst",
        }
        put_shovel(a.http_port, "durable", value)
        wait_state(a.http_port, "durable", "running")
        a.stop()
        a = RunningBroker(tmp_path / "a")
        try:
            wait_state(a.http_port, "durable", "running")
            publish(a.amqp_port, "src", numbered(25))
            wait_length(b.amqp_port, "dst", 25)
            assert bodies_of(b.amqp_port, "dst") == numbered(25)
        finally:
            a.stop()
    finally:
        b.stop()


def test_missing_destination_exchange_shows_in_status(broker: RunningBroker) -> None:
    publish(broker.amqp_port, "src", numbered(3))
    value = {
        "src-uri": "amqp://",
        "src-queue": "src",
        "dest-uri": "amqp://",
        "dest-exchange": "missing",
        "reconnect-delay": 0.5,
    }
    put_shovel(broker.http_port, "refused", value)

    def refused() -> dict[str, object] | None:
        status = shovel_status(broker.http_port, "refused")
        return status if status is not None and "NOT_FOUND" in str(status["error"]) else None

    status = wait_until(refused, "the refusal in the status")
    assert isinstance(status, dict) and "missing" in str(status["error"])
    assert queue_messages(broker.http_port, "src") == 3  # nothing lost, nothing acked
    value["dest-exchange"] = "amq.fanout"  # fixed: the shovel is replaced and runs
    connection = connect(broker.amqp_port)
    channel = connection.channel()
    channel.queue_declare("fanned", durable=True)
    channel.queue_bind("fanned", "amq.fanout")
    connection.close()
    put_shovel(broker.http_port, "refused", value)
    wait_length(broker.amqp_port, "fanned", 3)


class CountingServer:
    """A TCP listener on loopback that counts connections and closes each at once: a
    destination that refuses to speak AMQP."""

    def __init__(self) -> None:
        import socket  # noqa: PLC0415

        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.accepted = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


def test_unreachable_destination_is_retried_without_busy_loop(broker: RunningBroker) -> None:
    """A destination that closes every connection: the status says so, each attempt
    comes after the reconnect-delay (counted at the destination), and the broker's CPU
    time stays low meanwhile."""
    server = CountingServer()
    try:
        publish(broker.amqp_port, "src", numbered(5))
        value = {
            "src-uri": "amqp://",
            "src-queue": "src",
            "dest-uri": f"amqp://guest:secret@127.0.0.1:{server.port}/%2F",
            "dest-queue": "dst",
            "reconnect-delay": 1,
        }
        cpu_before = time.process_time()
        put_shovel(broker.http_port, "down", value)
        time.sleep(3.5)
        status = shovel_status(broker.http_port, "down")
        cpu_s = time.process_time() - cpu_before
        assert status is not None and status["state"] in ("terminated", "starting")
        assert status["error"] and "secret" not in str(status)
        assert 2 <= server.accepted <= 5, server.accepted  # one attempt per second
        assert cpu_s < 1.0, cpu_s  # this process holds the broker: no busy loop
        assert queue_length(broker.amqp_port, "src") == 5  # nothing lost
    finally:
        server.close()


class Receiver(http.server.ThreadingHTTPServer):
    """An HTTP endpoint for LavinMQ's HTTP destination: records each POST and answers
    with `status`."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), ReceiverHandler)
        self.status = 200
        self.posts: list[tuple[str, dict[str, str], bytes]] = []
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()


class ReceiverHandler(http.server.BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        self.server.posts.append((self.path, dict(self.headers.items()), body))
        self.send_response(self.server.status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_http_destination(broker: RunningBroker) -> None:
    receiver = Receiver()
    try:
        props = pika.BasicProperties(
            delivery_mode=2, content_type="text/plain", message_id="m-1", headers={"k": "v"}
        )
        publish(broker.amqp_port, "src", [b"one", b"two"], props)
        value = {
            "src-uri": "amqp://",
            "src-queue": "src",
            "dest-uri": f"http://127.0.0.1:{receiver.server_port}/hook",
            "reconnect-delay": 0.2,
        }
        put_shovel(broker.http_port, "web", value)
        wait_until(lambda: len(receiver.posts) == 2, "two POSTs")
        wait_until(lambda: queue_messages(broker.http_port, "src") == 0, "acked after 2xx")
        path, headers, body = receiver.posts[0]
        assert (path, body) == ("/hook", b"one")
        assert headers["X-Shovel"] == "web" and headers["Content-Type"] == "text/plain"
        assert headers["X-Message-Id"] == "m-1" and headers["X-k"] == "v"
        receiver.status = 500
        publish(broker.amqp_port, "src", [b"three"], props)
        wait_until(lambda: len(receiver.posts) >= 4, "the refused POST retried")

        def refused() -> dict[str, object] | None:
            status = shovel_status(broker.http_port, "web")
            return status if status is not None and "HTTP 500" in str(status["error"]) else None

        wait_until(refused, "the 500 in the status")  # between retries: state terminated
        assert queue_messages(broker.http_port, "src") == 1  # ready or unacked: kept
        receiver.status = 200
        wait_until(lambda: queue_messages(broker.http_port, "src") == 0, "acked once 2xx")
        assert receiver.posts[-1][2] == b"three"
    finally:
        receiver.shutdown()
        receiver.server_close()
