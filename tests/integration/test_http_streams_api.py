"""`POST /api/queues/{vhost}/{name}/stream` on a real broker: reads from first, last, an
offset and a timestamp across segment boundaries, nothing consumed (a consumer still
reads everything), payload encodings, and bad input and refused permissions."""

from __future__ import annotations

import time

import pika

from tests.integration.conftest import RunningBroker
from tests.integration.mgmt_http import call, connect, mgmt_broker

__all__ = ["mgmt_broker"]

SMALL_SEGMENTS = {"x-queue-type": "stream", "x-stream-max-segment-size-bytes": 4096}
PATH = "/api/queues/%2F/s/stream"


def publish(broker: RunningBroker, count: int, start: int = 0, size: int = 100) -> None:
    """`count` confirmed messages `0000....` (durable once confirmed) to stream `s`."""
    with connect(broker) as conn:
        channel = conn.channel()
        channel.queue_declare("s", durable=True, arguments=SMALL_SEGMENTS)
        channel.confirm_delivery()
        for n in range(start, start + count):
            channel.basic_publish(
                "",
                "s",
                f"{n:04d}".encode() + b"." * size,
                pika.BasicProperties(content_type="text/plain", headers={"n": n}),
            )


def bodies(got: object) -> list[str]:
    assert isinstance(got, list)
    return [m["payload"][:4] for m in got]


def test_read_from_first_offset_last_and_timestamp(mgmt_broker: RunningBroker) -> None:
    b = mgmt_broker
    publish(b, 100)  # about 140 bytes a record: several 4 KiB segments
    status, got, _ = call(b, "POST", PATH, {"count": 3})
    assert status == 200 and bodies(got) == ["0000", "0001", "0002"]
    first = got[0]
    assert first["offset"] == 0 and first["payload_encoding"] == "string"
    assert first["payload_bytes"] == 104 and first["redelivered"] is False
    assert first["routing_key"] == "s" and first["exchange"] == ""
    assert first["properties"]["content_type"] == "text/plain"
    assert first["properties"]["headers"] == {"n": 0}
    assert first["message_count"] == 99 and first["timestamp_ms"] > 0
    # From an offset, across segment boundaries, to the end (fewer than asked).
    status, got, _ = call(b, "POST", PATH, {"count": 50, "offset": 70})
    assert status == 200 and bodies(got) == [f"{n:04d}" for n in range(70, 100)]
    assert [m["offset"] for m in got] == list(range(70, 100))
    # last: the newest segment's first message, as for a consumer.
    status, got, _ = call(b, "POST", PATH, {"count": 100, "offset": "last"})
    assert status == 200 and 0 < len(got) < 100 and bodies(got)[-1] == "0099"
    queue = call(b, "GET", "/api/queues/%2F/s")[1]
    assert queue["segments"] > 2 and got[0]["offset"] > 0
    # Past the end: nothing.
    assert call(b, "POST", PATH, {"count": 5, "offset": 100})[1] == []
    # A timestamp: the first message appended then or later.
    time.sleep(0.01)
    after_ms = int(time.time() * 1000)
    time.sleep(0.01)
    publish(b, 5, start=100)
    status, got, _ = call(b, "POST", PATH, {"count": 10, "timestamp_ms": after_ms})
    assert status == 200 and bodies(got) == ["0100", "0101", "0102", "0103", "0104"]


def test_reading_consumes_nothing(mgmt_broker: RunningBroker) -> None:
    b = mgmt_broker
    publish(b, 10)
    assert len(call(b, "POST", PATH, {"count": 10})[1]) == 10
    assert len(call(b, "POST", PATH, {"count": 10})[1]) == 10
    with connect(b) as conn:
        channel = conn.channel()
        channel.basic_qos(prefetch_count=20)
        got = []
        for method, _, body in channel.consume(
            "s", arguments={"x-stream-offset": "first"}, inactivity_timeout=10
        ):
            assert method is not None
            got.append(body[:4])
            channel.basic_ack(method.delivery_tag)
            if len(got) == 10:
                break
        channel.cancel()
    assert got[0] == b"0000" and got[-1] == b"0009"
    assert call(b, "GET", "/api/queues/%2F/s")[1]["messages"] == 10


def test_encoding_and_truncate(mgmt_broker: RunningBroker) -> None:
    b = mgmt_broker
    publish(b, 1, size=10)
    got = call(b, "POST", PATH, {"encoding": "base64", "truncate": 4})[1]
    assert got[0]["payload"] == "MDAwMA==" and got[0]["payload_encoding"] == "base64"
    assert got[0]["payload_bytes"] == 14
    with connect(b) as conn:
        channel = conn.channel()
        channel.confirm_delivery()  # confirmed: durable, so readable
        channel.basic_publish("", "s", b"\xff\xfe")
    got = call(b, "POST", PATH, {"offset": 1})[1]
    assert got[0]["payload"] == "//4=" and got[0]["payload_encoding"] == "base64"


def test_bad_input(mgmt_broker: RunningBroker) -> None:
    b = mgmt_broker
    publish(b, 1)
    for body in (
        {"count": 0},
        {"count": 10_001},
        {"count": "3"},
        {"offset": -1},
        {"offset": "next"},
        {"offset": True},
        {"timestamp_ms": "now"},
        {"offset": 1, "timestamp_ms": 5},
        {"encoding": "hex"},
        {"truncate": -1},
    ):
        status, got, _ = call(b, "POST", PATH, body)
        assert status == 400 and got["error"] == "bad_request", body
    assert call(b, "POST", PATH, [1])[0] == 400
    assert call(b, "POST", "/api/queues/%2F/missing/stream", {})[0] == 404
    assert call(b, "POST", "/api/queues/nowhere/s/stream", {})[0] == 404
    assert call(b, "PUT", "/api/queues/%2F/classic", {})[0] == 201
    status, got, _ = call(b, "POST", "/api/queues/%2F/classic/stream", {})
    assert status == 400 and got["reason"] == "queue 'classic' in vhost '/' is not a stream"


def test_permissions(mgmt_broker: RunningBroker) -> None:
    b = mgmt_broker
    publish(b, 1)
    assert call(b, "POST", PATH, {}, user="readonly")[0] == 200
    # No permissions on the vhost: refused before anything is read.
    status, got, _ = call(b, "POST", PATH, {}, user="stranger")
    assert status == 403 and got["reason"] == "access to vhost '/' refused for user 'stranger'"
    # Permissions without read on the queue.
    perms = {"configure": ".*", "write": ".*", "read": "^$"}
    assert call(b, "PUT", "/api/permissions/%2F/stranger", perms)[0] == 201
    status, got, _ = call(b, "POST", PATH, {}, user="stranger")
    assert status == 403
    assert got["reason"] == "access to queue 's' in vhost '/' refused for user 'stranger'"
