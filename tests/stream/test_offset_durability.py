"""A stream's stored offsets survive SIGKILL on a quiet stream, a full disk, and a torn
or damaged record in their file.

Method: `streamq serve` as a child process (tests/integration/broker_process.py), driven
by the real rstream client (StoreOffset, QueryOffset) and by pika (an AMQP consumer with
`x-stream-automatic-offset-tracking`). A stream receives a few messages, then nothing:
offsets stored after that are durable within `STORE_SYNC_DELAY_S` all the same (before,
they were written only with the stream's next appends, and a SIGKILL lost them). On an
40 MB tmpfs filled to the last byte (tests/small_fs.py), offsets stored are held and
retried, never dropped and never written in part, and land once space returns, with no
restart. EIO on the file's writes or syncs (an LD_PRELOAD shim, tests/eio_shim.c) holds
them the same way, and the stream goes on. A record cut short or damaged on disk gives
back the previous valid offset, with a log line.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import signal
import time
from pathlib import Path

import pika
import pytest
from rstream import Consumer, OffsetNotFound, Producer

from streamq.queues.offset_file import decode_file, encode_record
from streamq.queues.offsets import STORE_SYNC_DELAY_S
from tests.eio_shim import EioShim
from tests.integration.broker_process import BrokerProcess
from tests.small_fs import fill, small_filesystem

HOST = "127.0.0.1"
TIMEOUT_S = 20
CREDENTIALS = {"username": "guest", "password": "guest"}
STREAM = "quiet"
# The wait before a SIGKILL: the bound, and room for the sync round it starts on a
# loaded machine.
DURABLE_WAIT_S = STORE_SYNC_DELAY_S + 1.0
STREAM_PORT = re.compile(rb"stream=127\.0\.0\.1:(\d+)")
REFERENCES = 200  # records of ~40 bytes: more than the page a full tmpfs may still have


def stream_port(broker: BrokerProcess) -> int:
    found = STREAM_PORT.search(broker.stderr)
    assert found is not None, broker.stderr
    return int(found[1])


def offsets_file(broker: BrokerProcess) -> Path:
    """The stream's offsets file (its log's directory is named by the SHA-1 of its name)."""
    digest = hashlib.sha1(STREAM.encode()).hexdigest()
    found = list(broker.data_dir.rglob(f"streams/{digest}.offsets"))
    assert len(found) == 1, found
    return found[0]


def log_of(broker: BrokerProcess) -> str:
    return broker.stderr.decode(errors="replace")


async def until_logged(broker: BrokerProcess, text: str) -> None:
    """Read the running broker's log (stderr) until it says `text`, for TIMEOUT_S at most."""
    pipe = broker.process.stderr
    assert pipe is not None
    deadline = time.monotonic() + TIMEOUT_S
    os.set_blocking(pipe.fileno(), False)
    try:
        while text.encode() not in broker.stderr:
            assert time.monotonic() < deadline, f"never logged {text!r}: {log_of(broker)}"
            broker.stderr += pipe.read() or b""
            await asyncio.sleep(0.05)
    finally:
        os.set_blocking(pipe.fileno(), True)


async def reader(broker: BrokerProcess) -> Consumer:
    consumer = Consumer(HOST, stream_port(broker), **CREDENTIALS)
    await consumer.start()
    return consumer


async def create_with_messages(broker: BrokerProcess, count: int) -> None:
    """The stream (created if missing) and `count` messages more in it."""
    producer = Producer(HOST, stream_port(broker), **CREDENTIALS)
    await producer.start()
    try:
        await producer.create_stream(STREAM, exists_ok=True)
        for n in range(count):
            await producer.send_wait(STREAM, b"m%d" % n)
    finally:
        await producer.close()


async def stored(consumer: Consumer, reference: str) -> int | None:
    try:
        return await consumer.query_offset(STREAM, reference)
    except OffsetNotFound:
        return None


def amqp_ack_first(broker: BrokerProcess, count: int) -> None:
    """A tracked AMQP consumer `reader` acks the first `count` messages (pika)."""
    connection = pika.BlockingConnection(pika.ConnectionParameters(HOST, broker.amqp_port))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=count)
    tracking = {"x-stream-offset": "first", "x-stream-automatic-offset-tracking": True}
    deliveries = channel.consume(
        STREAM, arguments=tracking, consumer_tag="reader", inactivity_timeout=TIMEOUT_S
    )
    for got, (method, _, _) in enumerate(deliveries, 1):
        assert method is not None, "no delivery"
        channel.basic_ack(method.delivery_tag)
        if got == count:
            break
    # Cancelling the consumer sends nothing that would write the offset file.
    connection.close()


def test_an_offset_stored_on_a_quiet_stream_survives_sigkill(tmp_path: Path) -> None:
    """Both sides: rstream's StoreOffset and an AMQP consumer's acks, on a stream that
    receives nothing after them, then SIGKILL after the bound: QueryOffset gives both."""
    data_dir = tmp_path / "data"

    async def before(broker: BrokerProcess) -> None:
        await create_with_messages(broker, 10)
        await asyncio.to_thread(amqp_ack_first, broker, 6)
        consumer = await reader(broker)
        try:
            await consumer.store_offset(STREAM, "app", 7)
            assert await stored(consumer, "app") == 7
            assert await stored(consumer, "reader") == 5
        finally:
            await consumer.close()
        await asyncio.sleep(DURABLE_WAIT_S)

    async def after(broker: BrokerProcess) -> tuple[int | None, int | None]:
        consumer = await reader(broker)
        try:
            return await stored(consumer, "app"), await stored(consumer, "reader")
        finally:
            await consumer.close()

    broker = BrokerProcess(data_dir)
    try:
        asyncio.run(asyncio.wait_for(before(broker), 3 * TIMEOUT_S))
    finally:
        broker.kill()
    again = BrokerProcess(data_dir)
    try:
        assert asyncio.run(asyncio.wait_for(after(again), TIMEOUT_S)) == (7, 5)
    finally:
        again.stop()


def on_disk(path: Path) -> tuple[dict[str, int], bool]:
    """The offsets the file holds and whether it is whole (no torn or damaged record)."""
    data = path.read_bytes()
    decoded = decode_file(str(path), data)
    return decoded.offsets, decoded.valid_bytes == len(data) and not decoded.damaged


async def until_on_disk(path: Path, want: dict[str, int]) -> dict[str, int]:
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        offsets, whole = on_disk(path)
        assert whole, "a partial or damaged record in the offsets file"
        if all(offsets.get(tag) == value for tag, value in want.items()):
            return offsets
        assert time.monotonic() < deadline, f"never on disk: {want} (file: {offsets})"
        await asyncio.sleep(0.05)


def test_offsets_stored_on_a_full_disk_are_held_then_written_when_space_returns(
    tmp_path: Path,
) -> None:
    """Filled to the last byte, the file system refuses the offsets' writes (hundreds of
    records: more than a page). They are held: QueryOffset answers the newest, the file
    holds no partial record and none of them, no task dies unseen. Space returns: the
    newest of each is written, without a restart, and survives SIGKILL."""
    with small_filesystem(tmp_path / "fs", "40m") as fs:
        data_dir = fs / "data"

        async def full(broker: BrokerProcess) -> None:
            await create_with_messages(broker, 3)
            path = offsets_file(broker)
            consumer = await reader(broker)
            try:
                await consumer.store_offset(STREAM, "early", 1)
                await until_on_disk(path, {"early": 1})
                filler = fill(fs / "filler", leave_bytes=0)
                newest = {f"ref-{n:03}": n for n in range(REFERENCES)}
                for value in (0, 1, 2):  # each reference stored three times, newest last
                    for tag, n in newest.items():
                        await consumer.store_offset(STREAM, tag, n * 10 + value)
                newest = {tag: n * 10 + 2 for tag, n in newest.items()}
                assert await stored(consumer, "ref-199") == newest["ref-199"]
                await asyncio.sleep(DURABLE_WAIT_S)
                offsets, whole = on_disk(path)
                assert whole, "a partial record in the offsets file"
                assert offsets == {"early": 1}, "written on a full disk?"
                for tag in ("ref-000", "ref-123", "ref-199"):
                    assert await stored(consumer, tag) == newest[tag]
                filler.unlink()
                await until_on_disk(path, newest)
                await until_logged(broker, "written again after")
            finally:
                await consumer.close()

        # The disk alarm's default limit (50 MB) would block the producer from the start.
        broker = BrokerProcess(data_dir, "--disk-free-limit", "1MiB")
        try:
            asyncio.run(asyncio.wait_for(full(broker), 4 * TIMEOUT_S))
        finally:
            broker.kill()
        log = log_of(broker)
        assert "Task exception was never retrieved" not in log, log
        assert "Traceback" not in log, log
        assert re.search(r"offsets file \S+\.offsets: write failed", log), log
        assert "out of disk space" in log and "writes resumed" in log, log
        assert "offsets file" in log and "written again after" in log, log

        async def after(broker: BrokerProcess) -> list[int | None]:
            consumer = await reader(broker)
            try:
                return [await stored(consumer, f"ref-{n:03}") for n in range(REFERENCES)]
            finally:
                await consumer.close()

        again = BrokerProcess(data_dir)
        try:
            restored = asyncio.run(asyncio.wait_for(after(again), TIMEOUT_S))
        finally:
            again.stop()
        assert restored == [n * 10 + 2 for n in range(REFERENCES)]


@pytest.mark.parametrize("fault", ["writes", "syncs"])
def test_offsets_meeting_eio_are_held_then_written_when_the_disk_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    """EIO on every write (or every fsync and fdatasync) of the offsets file, and of its
    replacement's temp file: stores are held, QueryOffset answers the newest, the stream
    still takes confirmed publishes (only the offsets' writes failed), and once the disk
    recovers the newest offsets are written without a restart and survive SIGKILL."""
    shim = EioShim(tmp_path / "shim", ".offsets")
    for name, value in shim.environment().items():
        monkeypatch.setenv(name, value)  # the broker process inherits them
    data_dir = tmp_path / "data"
    newest = {f"ref-{n}": 100 + n for n in range(20)}

    async def failing(broker: BrokerProcess) -> None:
        await create_with_messages(broker, 3)
        path = offsets_file(broker)
        consumer = await reader(broker)
        try:
            await consumer.store_offset(STREAM, "early", 1)
            await until_on_disk(path, {"early": 1})
            shim.fail(writes=fault == "writes", syncs=fault == "syncs")
            for tag, value in newest.items():
                await consumer.store_offset(STREAM, tag, value - 50)
                await consumer.store_offset(STREAM, tag, value)
            await asyncio.sleep(DURABLE_WAIT_S)
            assert await stored(consumer, "ref-7") == newest["ref-7"]
            await create_with_messages(broker, 2)  # confirmed: the stream did not fail
            shim.fail()
            await until_on_disk(path, newest)
            await until_logged(broker, "written again after")  # and synced
        finally:
            await consumer.close()

    broker = BrokerProcess(data_dir)
    try:
        asyncio.run(asyncio.wait_for(failing(broker), 4 * TIMEOUT_S))
    finally:
        broker.kill()
    log = log_of(broker)
    assert "Input/output error" in log and "write failed" in log, log
    assert "written again after" in log, log
    assert "Task exception was never retrieved" not in log and "Traceback" not in log, log
    monkeypatch.delenv("LD_PRELOAD")

    async def after(broker: BrokerProcess) -> dict[str, int | None]:
        consumer = await reader(broker)
        try:
            return {tag: await stored(consumer, tag) for tag in newest}
        finally:
            await consumer.close()

    again = BrokerProcess(data_dir)
    try:
        assert asyncio.run(asyncio.wait_for(after(again), TIMEOUT_S)) == newest
    finally:
        again.stop()


def test_a_torn_or_damaged_record_at_restart_gives_the_previous_offset(tmp_path: Path) -> None:
    """After SIGKILL, the file's last record is cut short (a torn write): the restart
    gives the offset before it, and says so. Then a record in the middle is damaged: only
    its tag goes back to its previous offset, and the restart says where."""
    data_dir = tmp_path / "data"

    async def store(broker: BrokerProcess, values: list[tuple[str, int]]) -> None:
        consumer = await reader(broker)
        try:
            for tag, value in values:
                await consumer.store_offset(STREAM, tag, value)
                await until_on_disk(offsets_file(broker), {tag: value})
        finally:
            await consumer.close()

    async def query(broker: BrokerProcess, tags: list[str]) -> list[int | None]:
        consumer = await reader(broker)
        try:
            return [await stored(consumer, tag) for tag in tags]
        finally:
            await consumer.close()

    broker = BrokerProcess(data_dir)
    try:
        asyncio.run(asyncio.wait_for(create_with_messages(broker, 3), TIMEOUT_S))
        asyncio.run(asyncio.wait_for(store(broker, [("a", 5), ("b", 6), ("a", 9)]), TIMEOUT_S))
    finally:
        broker.kill()
    path = offsets_file(broker)
    whole = path.read_bytes()
    torn = encode_record("a", 12)
    path.write_bytes(whole + torn[: len(torn) - 3])

    broker = BrokerProcess(data_dir)
    try:
        assert asyncio.run(asyncio.wait_for(query(broker, ["a", "b"]), TIMEOUT_S)) == [9, 6]
    finally:
        broker.kill()
    assert "torn last record" in log_of(broker), log_of(broker)
    assert path.read_bytes() == whole  # cut off

    # Damage a's 9 (the last record but one once c's is appended): a gives 5 again.
    damaged = bytearray(whole + encode_record("c", 3))
    position = len(whole) - len(encode_record("a", 9))
    damaged[position + 9] ^= 0x04
    path.write_bytes(bytes(damaged))
    broker = BrokerProcess(data_dir)
    try:
        got = asyncio.run(asyncio.wait_for(query(broker, ["a", "b", "c"]), TIMEOUT_S))
    finally:
        broker.stop(signal.SIGTERM)
    assert got == [5, 6, 3]
    assert f"damaged record at byte {position}" in log_of(broker), log_of(broker)
