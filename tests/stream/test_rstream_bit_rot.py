"""rstream over the stream protocol skips records lost to damage on disk: a chunk ends
before a damaged record and the next starts after it, so the subscriber receives every
other message with its own offset, and is not cut off (docs/durability.md, "Bit rot")."""

from __future__ import annotations

from pathlib import Path

from rstream import OffsetType

from tests.integration.bit_rot import damaged_messages, flip_in_body, record_spans, stream_dir
from tests.stream.conftest import (
    Clients,
    in_thread,
    numbered,
    pika_channel,
    send_confirmed,
    start_broker,
    stream_broker_on,
    subscribe,
)

COUNT = 600
SMALL_SEGMENTS = {"x-queue-type": "stream", "x-stream-max-segment-size-bytes": 8192}


async def test_a_subscriber_gets_every_message_but_the_damaged_ones(tmp_path: Path) -> None:
    """One record flipped in a sealed segment (found when the chunk is built) and one in
    the newest segment (found at recovery): both are lost, the other 598 arrive."""
    data_dir = tmp_path / "data"
    running = start_broker(data_dir)

    def declare() -> None:
        connection, channel = pika_channel(running)
        channel.queue_declare("events", durable=True, arguments=SMALL_SEGMENTS)
        connection.close()

    await in_thread(declare)
    clients = Clients(running)
    sender = await clients.producer()
    for start in range(0, COUNT, 100):
        await send_confirmed(sender, "events", numbered(100, start))
    await clients.close()
    running.stop()
    spans = record_spans(stream_dir(data_dir))
    sealed = [s for s in spans if s.path == spans[0].path]
    newest = [s for s in spans if s.path == spans[-1].path]
    assert sealed[0].path != newest[0].path
    lost = {sealed[len(sealed) // 2].offset, newest[len(newest) // 2].offset}
    flip_in_body(sealed[len(sealed) // 2])
    flip_in_body(newest[len(newest) // 2])
    with stream_broker_on(data_dir) as restarted:
        clients = Clients(restarted)
        try:
            reader = await clients.consumer()
            received = await subscribe(reader, "events", OffsetType.FIRST)
            await received.wait(COUNT - 2)
            await received.quiet()
        finally:
            await clients.close()
        kept = [n for n in range(COUNT) if n not in lost]
        assert received.offsets() == kept
        assert received.bodies() == [b"m%d" % n for n in kept]
        assert damaged_messages(restarted, "events") == 2
