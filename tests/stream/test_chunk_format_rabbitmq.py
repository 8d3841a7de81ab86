"""streamq/log/chunk.py's encoder against the chunks a real RabbitMQ (3.10, its stream
plugin, loopback ports of its own) delivers: for known messages (simple entries and an
uncompressed sub-entry batch), our chunk from the same entries, first offset, timestamp
and epoch is byte for byte the header and entries RabbitMQ sends. RabbitMQ 3.10 has no
filter values (the bloom filter is checked against Erlang in tests/unit/log/test_chunk.py).
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rstream import CompressionType, ConfirmationStatus, Consumer, schema

from streamq.log import chunk as ck
from tests.differential.peers import RabbitMQServer, free_port
from tests.stream.conftest import CREDENTIALS, HOST, Clients, send_confirmed, subscribe
from tests.stream.test_client_quirks_rabbitmq import Peer, StreamPeer

WAIT_S = 30.0


@pytest.fixture(scope="module")
def rabbitmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StreamPeer]:
    port = free_port()
    server = RabbitMQServer(
        Path(tmp_path_factory.mktemp("rabbitmq-chunks")),
        plugins=("rabbitmq_stream",),
        extra_config=f"stream.listeners.tcp.1 = 127.0.0.1:{port}\n"
        "stream.advertised_host = 127.0.0.1\n",
    )
    try:
        yield StreamPeer("rabbitmq", port, server.http_port)
    finally:
        server.stop()


class ChunkRecorder(Consumer):
    """An rstream consumer that also keeps every Deliver frame it handles."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.frames: list[schema.Deliver] = []
        self.records = 0
        self.enough = asyncio.Event()
        self.wanted = 0

    async def _on_deliver(self, frame: schema.Deliver, *args: Any, **kwargs: Any) -> None:
        self.frames.append(frame)
        self.records += frame.num_records
        if self.records >= self.wanted:
            self.enough.set()
        await super()._on_deliver(frame, *args, **kwargs)


def _batch_body(messages: list[bytes]) -> bytes:
    return b"".join(struct.pack(">I", len(m)) + m for m in messages)


async def test_rabbitmq_chunks_are_our_encoding(rabbitmq: StreamPeer) -> None:
    clients = Clients(Peer(rabbitmq))
    try:
        producer = await clients.producer()
        stream = "chunk-format"
        await producer.create_stream(stream)
        simple = [b"alpha", b"b" * 300, b"\x00\x53\x75\xa0\x01x"]
        statuses = await send_confirmed(producer, stream, simple)
        assert all(s.is_confirmed for s in statuses)
        batch = [b"one", b"two" * 40]
        confirmed = asyncio.Event()

        async def on_confirm(status: ConfirmationStatus) -> None:
            confirmed.set()

        await producer.send_sub_entry(
            stream, batch, CompressionType.No, on_publish_confirm=on_confirm
        )
        await asyncio.wait_for(confirmed.wait(), WAIT_S)

        consumer = await clients.start(ChunkRecorder(HOST, rabbitmq.stream_port, **CREDENTIALS))
        consumer.wanted = len(simple) + len(batch)
        await subscribe(consumer, stream)
        await asyncio.wait_for(consumer.enough.wait(), WAIT_S)
        frames = consumer.frames
    finally:
        await clients.close()

    body = _batch_body(batch)
    expected: list[ck.Entry] = [ck.SimpleEntry(m) for m in simple]
    expected.append(ck.SubBatch(body, len(batch), ck.COMPRESSION_NONE, len(body)))
    for frame in frames:
        header = struct.pack(
            ">BBHIqQQIIIB3x", frame.magic_version, frame.chunk_type, frame.num_entries,
            frame.num_records, frame.timestamp, frame.epoch, frame.chunk_first_offset,
            frame.chunk_crc, frame.data_length, frame.trailer_length, frame._reserved >> 24,
        )  # fmt: skip
        theirs = header + frame.data
        mine_entries, expected = expected[: frame.num_entries], expected[frame.num_entries :]
        mine = ck.encode_chunk(mine_entries, frame.chunk_first_offset, frame.timestamp, frame.epoch)
        assert mine == theirs, (frame, mine_entries)
        assert ck.check_chunk(mine).epoch == frame.epoch
    assert expected == []
    assert frames[0].chunk_first_offset == 0
    print(f"RabbitMQ epoch of a fresh single-node stream: {frames[0].epoch}")
