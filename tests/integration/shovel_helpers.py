"""What the shovel tests share: creating a shovel through the management API, waiting for
its state, and publishing and reading numbered messages with pika."""

from __future__ import annotations

import base64
import http.client
import json
import time
import urllib.parse
from collections.abc import Callable, Iterable

import pika
from pika.adapters.blocking_connection import BlockingChannel

TIMEOUT_S = 30.0


def connect(port: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", port, blocked_connection_timeout=TIMEOUT_S)
    )


def amqp_uri(port: int, vhost: str = "/") -> str:
    return f"amqp://guest:guest@127.0.0.1:{port}/{urllib.parse.quote(vhost, safe='')}"


def http_call(port: int, method: str, path: str, body: object = None) -> tuple[int, object]:
    """One management API call as guest: (status, the JSON body or text or None)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
    token = base64.b64encode(b"guest:guest").decode()
    headers = {"Authorization": f"Basic {token}", "Content-Type": "application/json"}
    try:
        conn.request(method, path, None if body is None else json.dumps(body), headers)
        response = conn.getresponse()
        data = response.read()
    finally:
        conn.close()
    if data and response.getheader("Content-Type", "").startswith("application/json"):
        return response.status, json.loads(data)
    return response.status, data.decode() if data else None


def put_shovel(http_port: int, name: str, value: dict[str, object], vhost: str = "/") -> None:
    path = f"/api/parameters/shovel/{urllib.parse.quote(vhost, safe='')}/{name}"
    status, body = http_call(http_port, "PUT", path, {"value": value})
    assert status in (200, 201, 204), (status, body)


def shovel_status(http_port: int, name: str, vhost: str = "/") -> dict[str, object] | None:
    status, body = http_call(http_port, "GET", f"/api/shovels/{urllib.parse.quote(vhost, safe='')}")
    assert status == 200, (status, body)
    assert isinstance(body, list)
    for entry in body:
        if entry["name"] == name:
            return dict(entry)
    return None


def wait_until(check: Callable[[], object], what: str, timeout_s: float = TIMEOUT_S) -> object:
    """Poll `check()` every 50 ms until it is truthy; its value. Fails after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def wait_state(http_port: int, name: str, state: str, vhost: str = "/") -> dict[str, object]:
    def check() -> dict[str, object] | None:
        found = shovel_status(http_port, name, vhost)
        return found if found is not None and found["state"] == state else None

    found = wait_until(check, f"shovel {name} {state}")
    assert isinstance(found, dict)
    return found


def publish(
    port: int,
    queue: str,
    bodies: Iterable[bytes],
    properties: pika.BasicProperties | None = None,
    exchange: str = "",
    declare: bool = True,
) -> None:
    """Publish persistent `bodies` to `queue` (declared durable) under confirms."""
    connection = connect(port)
    try:
        channel = connection.channel()
        if declare:
            channel.queue_declare(queue, durable=True)
        channel.confirm_delivery()
        props = properties or pika.BasicProperties(delivery_mode=2)
        for body in bodies:
            channel.basic_publish(exchange, queue, body, props)
    finally:
        connection.close()


def numbered(count: int, start: int = 0) -> list[bytes]:
    return [b"%08d" % i for i in range(start, start + count)]


def queue_length(port: int, queue: str) -> int:
    """The ready messages of `queue` (0 while it does not exist yet)."""
    connection = connect(port)
    try:
        declared = connection.channel().queue_declare(queue, passive=True)
        return int(declared.method.message_count)
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code == 404:
            return 0
        raise
    finally:
        if connection.is_open:
            connection.close()


def queue_messages(http_port: int, queue: str, vhost: str = "/") -> int:
    """Ready plus unacked messages of `queue` (the management API's `messages`; -1 while
    RabbitMQ has not emitted the queue's statistics yet)."""
    path = f"/api/queues/{urllib.parse.quote(vhost, safe='')}/{urllib.parse.quote(queue, safe='')}"
    status, body = http_call(http_port, "GET", path)
    assert status == 200 and isinstance(body, dict), (status, body)
    return int(body.get("messages", -1))


def wait_length(port: int, queue: str, count: int, timeout_s: float = TIMEOUT_S) -> None:
    wait_until(
        lambda: queue_length(port, queue) >= count, f"{count} messages in {queue}", timeout_s
    )


def take_all(channel: BlockingChannel, queue: str) -> list[tuple[pika.BasicProperties, bytes]]:
    """Every message of `queue` now, (properties, body), with basic.get and auto-ack."""
    got = []
    while True:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return got
        got.append((properties, body))


def bodies_of(port: int, queue: str) -> list[bytes]:
    connection = connect(port)
    try:
        return [body for _, body in take_all(connection.channel(), queue)]
    finally:
        connection.close()
