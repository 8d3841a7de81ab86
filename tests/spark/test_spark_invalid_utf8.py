"""Property strings that are not UTF-8 (a known bug: the source raised UnicodeEncodeError).

AMQP 0-9-1 short strings and AMQP 1.0 strings are bytes on the wire, and a raw client can
put anything in them: invalid UTF-8, or the UTF-8 form of a lone surrogate. The broker
stores them as they came; Spark's string columns hold only UTF-8, so the source gives
such a string with each bad byte replaced by U+FFFD (docs/spark.md). Header values stay
the bytes they were (the `headers` column is binary). Written by pika (bytes property
values and header keys go on the wire as they are) and by a stream-protocol raw frame
(an AMQP 1.0 message built by hand), read in one real SparkSession."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from stream_gateway.codec import commands as c
from tests.integration.conftest import RunningBroker
from tests.stream.test_gateway_protocol import RawClient

pytestmark = pytest.mark.spark

LONE_SURROGATE = b"\xed\xa0\x80"  # U+D800 encoded as if it were a character
INVALID = b"\xff\xfe"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[RunningBroker]:
    running = RunningBroker(tmp_path / "data", stream_port=0)
    yield running
    running.stop()


def publish_amqp(broker: RunningBroker) -> None:
    connection = pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", broker.amqp_port, blocked_connection_timeout=10)
    )
    try:
        channel = connection.channel()
        channel.queue_declare("odd", durable=True, arguments={"x-queue-type": "stream"})
        channel.confirm_delivery()
        properties = pika.BasicProperties(
            content_type=b"text/" + INVALID,  # type: ignore[arg-type]  # bytes: sent as is
            app_id=b"app" + LONE_SURROGATE,  # type: ignore[arg-type]
            headers={b"key" + LONE_SURROGATE: b"v" + INVALID},  # type: ignore[dict-item]
        )
        channel.basic_publish("", "odd", b"from amqp", properties)
    finally:
        connection.close()


def amqp10_message(body: bytes) -> bytes:
    """Properties (content-encoding... as str8 with a lone surrogate in group-id),
    application-properties with an invalid UTF-8 key, and one data section."""
    str8 = lambda raw: b"\xa1" + bytes([len(raw)]) + raw  # noqa: E731
    fields = b"\x40" * 10 + str8(b"group" + LONE_SURROGATE)  # group-id is the 11th field
    properties = b"\x00\x53\x73\xc0" + bytes([len(fields) + 1, 11]) + fields
    pairs = str8(b"k" + INVALID) + str8(b"value")
    application = b"\x00\x53\x74\xc1" + bytes([len(pairs) + 1, 2]) + pairs
    data = b"\x00\x53\x75\xa0" + bytes([len(body)]) + body
    return properties + application + data


def publish_stream(broker: RunningBroker) -> None:
    raw = RawClient(broker.stream_port)
    try:
        raw.login()
        raw.request(c.DeclarePublisher(raw.next_id(), 0, "", "odd"))
        raw.send(c.Publish(0, (c.PublishedMessage(1, amqp10_message(b"from stream")),)))
        assert raw.read_until(c.PublishConfirm) == c.PublishConfirm(0, (1,))
    finally:
        raw.close()


def test_strings_that_are_not_utf8_read_with_replacement_characters(
    spark: Any, broker: RunningBroker
) -> None:
    publish_amqp(broker)
    publish_stream(broker)
    df = (
        spark.read.format("streamq")
        .option("path", str(broker.data_dir))
        .option("stream", "odd")
        .option("includeHeaders", "true")
        .load()
    )
    first, second = sorted(df.collect(), key=lambda row: row.offset)
    assert bytes(first.body) == b"from amqp"
    assert first.properties.content_type == "text/\ufffd\ufffd"
    assert first.properties.app_id == "app\ufffd\ufffd\ufffd"
    assert [(h.key, bytes(h.value)) for h in first.headers] == [
        ("key\ufffd\ufffd\ufffd", b"v" + INVALID)
    ]
    assert bytes(second.body) == b"from stream"
    assert second.properties.app_id == "group\ufffd\ufffd\ufffd"  # group-id -> app-id
    headers = {h.key: bytes(h.value) for h in second.headers}
    assert headers == {"k\ufffd\ufffd": b"value"}
