"""A stream written in format version 1 (today's main: the tests/upgrade/data fixtures)
goes on in version 2 (docs/log-format.md): its version-1 segments are read as they are,
appends go to version-2 segments after them, deduplication carries over, and every
reader (rstream from first, an AMQP consumer, the HTTP stream browser) sees one log,
also after a restart that reads the version-2 segments back."""

from __future__ import annotations

import asyncio
import json
import tarfile
import time
from pathlib import Path
from typing import Any

from rstream import AMQPMessage, Consumer, Producer

from streamq.log import format as fmt
from tests.integration.broker_process import BrokerProcess
from tests.upgrade.test_data_directories import (
    DATA,
    HOST,
    TIMEOUT_S,
    Restored,
    read_from_first,
)

FIXTURE = DATA / "0.1.0-85ad199e5d-clean.json"
NEW = 30  # messages published after the upgrade


def unpack(where: Path) -> dict[str, Any]:
    with tarfile.open(FIXTURE.with_suffix(".tar.gz")) as tar:
        tar.extractall(where, filter="data")
    return dict(json.loads(FIXTURE.read_text()))


def segment_versions(data_dir: Path) -> list[int]:
    [directory] = [p for p in (data_dir / "vhosts").glob("*/streams/*") if p.is_dir()]
    return [
        fmt.decode_segment_version(path.read_bytes()[: fmt.SEGMENT_HEADER_BYTES])
        for path in sorted(directory.glob("*.seg"))
    ]


async def publish_more(restored: Restored, stream: str, reference: str) -> tuple[int, int]:
    """Publish NEW messages with the fixture's publisher reference (its ids go on from
    the sequence stored in version 1); returns (confirmed, the sequence after)."""
    producer = Producer(HOST, restored.stream_port, username="guest", password="guest")
    await producer.start()
    confirmed: list[Any] = []
    done = asyncio.Event()

    async def on_confirm(status: Any) -> None:
        confirmed.append(status)
        if len(confirmed) == NEW:
            done.set()

    try:
        messages = [AMQPMessage(body=f"new-{n:03d}".encode()) for n in range(NEW)]
        await producer.send_batch(stream, messages, reference, on_confirm)
        await asyncio.wait_for(done.wait(), TIMEOUT_S)
        client = await producer.default_client
        return len(confirmed), await client.query_publisher_sequence(stream, reference)
    finally:
        await producer.close()


async def sequence_of(restored: Restored, stream: str, reference: str) -> int:
    producer = Producer(HOST, restored.stream_port, username="guest", password="guest")
    await producer.start()
    try:
        client = await producer.default_client
        return int(await client.query_publisher_sequence(stream, reference))
    finally:
        await producer.close()


def amqp_bodies(restored: Restored, stream: str, count: int) -> list[bytes]:
    connection = restored.amqp()
    channel = connection.channel()
    channel.basic_qos(prefetch_count=100)
    got: list[bytes] = []

    def on_message(_ch: object, method: Any, _p: object, body: bytes) -> None:
        got.append(body)
        channel.basic_ack(method.delivery_tag)

    channel.basic_consume(stream, on_message, arguments={"x-stream-offset": "first"})
    deadline = time.monotonic() + TIMEOUT_S
    while len(got) < count and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)
    connection.close()
    return got


def test_a_version_1_stream_goes_on_in_version_2(tmp_path: Path) -> None:
    manifest = unpack(tmp_path)
    [expected] = manifest["streams"]
    name, old = expected["name"], expected["records"]
    [(reference, sequence)] = expected["publishers"].items()
    assert set(segment_versions(tmp_path / "data")) == {1}
    broker = BrokerProcess(tmp_path / "data")
    try:
        restored = Restored(manifest, broker)
        assert asyncio.run(sequence_of(restored, name, reference)) == sequence
        assert asyncio.run(publish_more(restored, name, reference)) == (NEW, sequence + NEW)
        versions = segment_versions(tmp_path / "data")
        assert versions[0] == 1 and versions[-1] == 2, versions
        assert versions == sorted(versions)
        new = [f"new-{n:03d}" for n in range(NEW)]
        with_new = asyncio.run(_read(restored, name, len(old) + len(new)))
        assert with_new == old + new
        assert [b.decode() for b in amqp_bodies(restored, name, len(old) + len(new))] == (old + new)
    finally:
        assert broker.stop() == 0, broker.stderr[-4000:]
    broker = BrokerProcess(tmp_path / "data")  # version-2 segments read back at start
    try:
        restored = Restored(manifest, broker)
        assert asyncio.run(_read(restored, name, len(old) + NEW))[-1] == f"new-{NEW - 1:03d}"
        # The sequence from the version-2 chunks' trailers and the publishers file.
        assert asyncio.run(sequence_of(restored, name, reference)) == sequence + NEW
    finally:
        assert broker.stop() == 0, broker.stderr[-4000:]


async def _read(restored: Restored, stream: str, count: int) -> list[str]:
    consumer = Consumer(HOST, restored.stream_port, username="guest", password="guest")
    await consumer.start()
    try:
        return await read_from_first(consumer, stream, count)
    finally:
        await consumer.close()
