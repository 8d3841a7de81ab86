"""rstream publishes over the stream protocol: every message confirmed and stored once, in
order; a publisher reference deduplicates by publishing id, and its sequence
(QueryPublisherSequence) survives a restart and a SIGKILL of the broker."""

from __future__ import annotations

from pathlib import Path

from rstream import AMQPMessage, OffsetType, Producer, RawMessage

from tests.differential.peers import free_port
from tests.integration.broker_process import BrokerProcess
from tests.integration.conftest import RunningBroker
from tests.stream.conftest import (
    CREDENTIALS,
    HOST,
    consumer,
    numbered,
    producer,
    send_confirmed,
    stream_broker_on,
    subscribe,
)


def with_id(body: bytes, publishing_id: int) -> RawMessage:
    """An AMQP 1.0 message with its own publishing id (rstream's AMQPMessage takes none:
    its RawMessage carries the encoded bytes and the id)."""
    return RawMessage(bytes(AMQPMessage(body=body)), publishing_id)


async def query_sequence(sender: Producer, stream: str, reference: str) -> int:
    client = await sender.default_client
    return await client.query_publisher_sequence(stream, reference)


async def read_all(broker: RunningBroker, stream: str, count: int) -> list[bytes]:
    """The bodies of the stream read from first, once `count` came and no more followed."""
    async with consumer(broker) as reader:
        received = await subscribe(reader, stream, OffsetType.FIRST)
        await received.wait(count)
        await received.quiet()
        assert received.offsets() == list(range(len(received.items)))
        return received.bodies()


async def test_every_message_is_confirmed_and_stored_in_order(broker: RunningBroker) -> None:
    async with producer(broker) as sender:
        await sender.create_stream("events")
        statuses = await send_confirmed(sender, "events", numbered(500))
        assert all(status.is_confirmed for status in statuses)
        assert sorted(status.message_id for status in statuses) == list(range(1, 501))
        raw = await send_confirmed(sender, "events", [b"raw bytes, not AMQP 1.0"])
        assert raw[0].is_confirmed
    bodies = await read_all(broker, "events", 501)
    assert bodies == [b"m%d" % n for n in range(500)] + [b"raw bytes, not AMQP 1.0"]


async def test_a_reference_resumes_its_sequence_and_unknown_ones_are_zero(
    broker: RunningBroker,
) -> None:
    async with producer(broker) as sender:
        await sender.create_stream("events")
        assert await query_sequence(sender, "events", "app") == 0
        await send_confirmed(sender, "events", numbered(10), publisher_name="app")
        assert await query_sequence(sender, "events", "app") == 10
        assert await query_sequence(sender, "events", "other") == 0
    # A new producer with the same reference: rstream asks for the sequence and goes on.
    async with producer(broker) as sender:
        statuses = await send_confirmed(sender, "events", numbered(5, 10), publisher_name="app")
        assert sorted(status.message_id for status in statuses) == list(range(11, 16))
        assert await query_sequence(sender, "events", "app") == 15
    assert await read_all(broker, "events", 15) == [b"m%d" % n for n in range(15)]


async def test_resent_publishing_ids_are_confirmed_but_stored_once(
    broker: RunningBroker,
) -> None:
    async with producer(broker) as sender:
        await sender.create_stream("events")
        await send_confirmed(sender, "events", numbered(20), publisher_name="app")
        # A producer that lost its confirms sends 11..20 again, then 21..25: the broker
        # confirms every id (the client must not wait forever) but stores only 21..25.
        again = [with_id(b"again %d" % n, n) for n in range(11, 26)]
        statuses = await send_confirmed(sender, "events", again, publisher_name="app")
        assert sorted(status.message_id for status in statuses) == list(range(11, 26))
        assert await query_sequence(sender, "events", "app") == 25
    async with producer(broker) as sender:  # without a reference nothing is deduplicated
        await send_confirmed(sender, "events", [with_id(b"free", 1)])
    want = [b"m%d" % n for n in range(20)] + [b"again %d" % n for n in range(21, 26)]
    assert await read_all(broker, "events", 26) == [*want, b"free"]


async def test_the_sequence_survives_a_restart(tmp_path: Path) -> None:
    with stream_broker_on(tmp_path / "data") as broker:
        async with producer(broker) as sender:
            await sender.create_stream("events")
            await send_confirmed(sender, "events", numbered(300), publisher_name="app")
    with stream_broker_on(tmp_path / "data") as broker:
        async with producer(broker) as sender:
            assert await query_sequence(sender, "events", "app") == 300
            resent = [with_id(b"dup", n) for n in (299, 300)]
            await send_confirmed(sender, "events", resent, publisher_name="app")
            await send_confirmed(sender, "events", numbered(1, 300), publisher_name="app")
            assert await query_sequence(sender, "events", "app") == 301
        assert await read_all(broker, "events", 301) == [b"m%d" % n for n in range(301)]


async def test_the_sequence_of_confirmed_messages_survives_a_sigkill(tmp_path: Path) -> None:
    port = free_port()
    process = BrokerProcess(tmp_path / "data", "--stream-port", str(port))
    try:
        async with Producer(HOST, port, **CREDENTIALS) as sender:
            await sender.create_stream("events")
            await send_confirmed(sender, "events", numbered(1000), publisher_name="app")
        process.kill()
        process = BrokerProcess(tmp_path / "data", "--stream-port", str(port))
        async with Producer(HOST, port, **CREDENTIALS) as sender:
            # Everything confirmed is there; the sequence may be no lower.
            assert await query_sequence(sender, "events", "app") == 1000
    finally:
        process.stop()
