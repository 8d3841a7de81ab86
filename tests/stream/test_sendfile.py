"""Stream consumers get stored chunks of sealed segments by os.sendfile on plain TCP, and
by a copy over TLS; either way rstream receives every message in order."""

from __future__ import annotations

import asyncio
from pathlib import Path

from rstream import (
    AMQPMessage,
    Consumer,
    ConsumerOffsetSpecification,
    OffsetType,
    Producer,
    amqp_decoder,
)

from stream_gateway.subscriptions import SendfileCount
from tests.integration.conftest import RunningBroker
from tests.integration.tls_setup import Certs, client_context, pki, port_of
from tests.stream.conftest import stream_port

__all__ = ["pki"]  # a fixture, used by name
TIMEOUT_S = 20
COUNT = 600
SMALL_SEGMENTS = {"stream-max-segment-size-bytes": "8192"}


async def publish_and_read(host: str, port: int, login: dict[str, object]) -> list[bytes]:
    async with Producer(host, port, **login) as producer:  # type: ignore[arg-type]
        await producer.create_stream("events", arguments=SMALL_SEGMENTS)
        for start in range(0, COUNT, 100):  # several chunks, several sealed segments
            batch = [AMQPMessage(body=b"m%d" % n + b"x" * 100) for n in range(start, start + 100)]
            await producer.send_batch("events", batch)
            await asyncio.sleep(0.05)
    received: list[bytes] = []
    done = asyncio.Event()

    async def on_message(message: AMQPMessage, _context: object) -> None:
        received.append(bytes(message.body))
        if len(received) == COUNT:
            done.set()

    async with Consumer(host, port, **login) as consumer:  # type: ignore[arg-type]
        spec = ConsumerOffsetSpecification(OffsetType.FIRST)
        await consumer.subscribe(
            "events", on_message, decoder=amqp_decoder, offset_specification=spec
        )
        await asyncio.wait_for(done.wait(), TIMEOUT_S)
    return received


async def test_plain_tcp_consumers_get_sealed_chunks_by_sendfile(tmp_path: Path) -> None:
    running = RunningBroker(tmp_path / "data", stream_port=0)
    try:
        before = SendfileCount.bytes
        login: dict[str, object] = {"username": "guest", "password": "guest"}
        received = await publish_and_read("127.0.0.1", stream_port(running), login)
        assert received == [b"m%d" % n + b"x" * 100 for n in range(COUNT)]
        assert SendfileCount.bytes - before > COUNT // 2 * 100  # most came from sealed files
    finally:
        running.stop()


async def test_tls_consumers_get_a_copy(tmp_path: Path, pki: Certs) -> None:
    running = RunningBroker(
        tmp_path / "data",
        streams_port=0,
        tls_cert=str(pki.server.cert),
        tls_key=str(pki.server.key),
        tls_verify_peer=True,
        tls_ca_cert=str(pki.ca.cert),
    )
    try:
        before = SendfileCount.bytes
        context = client_context(pki.ca, pki.client_guest)
        login: dict[str, object] = {
            "username": "guest",
            "password": "guest",
            "ssl_context": context,
        }
        received = await publish_and_read("localhost", port_of(running, "stream/ssl"), login)
        assert received == [b"m%d" % n + b"x" * 100 for n in range(COUNT)]
        assert SendfileCount.bytes == before
    finally:
        running.stop()
