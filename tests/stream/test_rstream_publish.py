"""rstream publishes over the stream protocol: every message confirmed and stored once, in
order; a publisher reference deduplicates by publishing id, and its sequence
(QueryPublisherSequence) survives a SIGKILL of the broker and its restart."""

from __future__ import annotations

import asyncio
from pathlib import Path

from rstream import AMQPMessage, Consumer, OffsetType, Producer, RawMessage

from tests.differential.peers import free_port
from tests.integration.broker_process import BrokerProcess
from tests.stream.conftest import CREDENTIALS, HOST, Clients, numbered, send_confirmed, subscribe


def with_id(body: bytes, publishing_id: int) -> RawMessage:
    """An AMQP 1.0 message with its own publishing id (rstream's AMQPMessage takes none:
    its RawMessage carries the encoded bytes and the id)."""
    return RawMessage(bytes(AMQPMessage(body=body)), publishing_id)


async def query_sequence(sender: Producer, stream: str, reference: str) -> int:
    client = await sender.default_client
    return await client.query_publisher_sequence(stream, reference)


async def read_all(reader: Consumer, stream: str, count: int) -> list[bytes]:
    """The bodies of the stream read from first, once `count` came and no more followed."""
    received = await subscribe(reader, stream, OffsetType.FIRST)
    await received.wait(count)
    await received.quiet()
    assert received.offsets() == list(range(len(received.items)))
    return received.bodies()


async def test_every_message_is_confirmed_and_stored_in_order(clients: Clients) -> None:
    sender = await clients.producer()
    await sender.create_stream("events")
    statuses = await send_confirmed(sender, "events", numbered(500))
    assert all(status.is_confirmed for status in statuses)
    assert sorted(status.message_id for status in statuses) == list(range(1, 501))
    raw = await send_confirmed(sender, "events", [b"raw bytes, not AMQP 1.0"])
    assert raw[0].is_confirmed
    bodies = await read_all(await clients.consumer(), "events", 501)
    assert bodies == [b"m%d" % n for n in range(500)] + [b"raw bytes, not AMQP 1.0"]


async def test_a_reference_resumes_its_sequence_and_unknown_ones_are_zero(
    clients: Clients,
) -> None:
    sender = await clients.producer()
    await sender.create_stream("events")
    assert await query_sequence(sender, "events", "app") == 0
    await send_confirmed(sender, "events", numbered(10), publisher_name="app")
    assert await query_sequence(sender, "events", "app") == 10
    assert await query_sequence(sender, "events", "other") == 0
    # The application restarts: its new producer with the same reference asks for the
    # sequence and goes on from it.
    await sender.close()
    again = await clients.producer()
    statuses = await send_confirmed(again, "events", numbered(5, 10), publisher_name="app")
    assert sorted(status.message_id for status in statuses) == list(range(11, 16))
    assert await query_sequence(again, "events", "app") == 15
    want = [b"m%d" % n for n in range(15)]
    assert await read_all(await clients.consumer(), "events", 15) == want


async def test_resent_publishing_ids_are_confirmed_but_stored_once(clients: Clients) -> None:
    sender = await clients.producer()
    await sender.create_stream("events")
    await send_confirmed(sender, "events", numbered(20), publisher_name="app")
    # A producer that lost its confirms sends 11..20 again, then 21..25: the broker
    # confirms every id (the client must not wait forever) but stores only 21..25.
    again = [with_id(b"again %d" % n, n) for n in range(11, 26)]
    statuses = await send_confirmed(sender, "events", again, publisher_name="app")
    assert sorted(status.message_id for status in statuses) == list(range(11, 26))
    assert await query_sequence(sender, "events", "app") == 25
    # Without a reference nothing is deduplicated (a producer has one publisher a stream).
    unnamed = await clients.producer()
    await send_confirmed(unnamed, "events", [with_id(b"free", 1)])
    want = [b"m%d" % n for n in range(20)] + [b"again %d" % n for n in range(21, 26)]
    assert await read_all(await clients.consumer(), "events", 26) == [*want, b"free"]


async def test_the_sequence_survives_a_sigkill_and_deduplicates_after_it(
    tmp_path: Path,
) -> None:
    """Everything confirmed before the SIGKILL is stored and counted in the sequence: the
    restarted broker rebuilds it from its files and refuses those ids again."""
    port = free_port()
    process = BrokerProcess(tmp_path / "data", "--stream-port", str(port))
    sender = Producer(HOST, port, **CREDENTIALS)
    try:
        await sender.start()
        await sender.create_stream("events")
        await send_confirmed(sender, "events", numbered(1000), publisher_name="app")
        await sender.close()  # rstream's close waits 5 s for a broker that died under it
        process.kill()
        process = BrokerProcess(tmp_path / "data", "--stream-port", str(port))
        sender = Producer(HOST, port, **CREDENTIALS)
        await sender.start()
        assert await query_sequence(sender, "events", "app") == 1000
        resent = [with_id(b"dup", n) for n in (999, 1000)]
        await send_confirmed(sender, "events", resent, publisher_name="app")
        await send_confirmed(sender, "events", numbered(1, 1000), publisher_name="app")
        assert await query_sequence(sender, "events", "app") == 1001
        reader = Consumer(HOST, port, **CREDENTIALS)
        await reader.start()
        try:
            want = [b"m%d" % n for n in range(1001)]
            assert await read_all(reader, "events", 1001) == want
        finally:
            await asyncio.gather(reader.close(), sender.close())
    finally:
        process.stop()
