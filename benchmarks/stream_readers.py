"""Stream reads as real clients make them, streamq against RabbitMQ's stream plugin in one
run: rstream and rbfly reading a stream from first (each decodes every message), and
eight readers of one stream at once (benchmarks/stream_client.py, counting records from
chunk headers), in aggregate.

For each body size, each broker gets a fresh stream filled by `StreamClient.publish`
under confirms, then each read runs in turn, `--rounds` times; the table has the median
rates and streamq / RabbitMQ. Both brokers are started here (`stream_compare.py`'s
`started_brokers`: fresh directories, loopback, free ports).

    PYTHONPATH=. python benchmarks/stream_readers.py --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Final

from rbfly.streams import Offset, streams_client
from rstream import AMQPMessage, Consumer, ConsumerOffsetSpecification, OffsetType, amqp_decoder

from benchmarks.stream_client import StreamClient, amqp10_data
from benchmarks.stream_compare import BATCH, CREDIT, WINDOW, started_brokers

READERS: Final = 8
TIMEOUT_S: Final = 300.0
Address = tuple[str, int]


async def fill(address: Address, stream: str, body_bytes: int, count: int) -> None:
    client = await StreamClient.connect(*address)
    try:
        await client.create(stream)
        await client.publish(stream, amqp10_data(b"x" * body_bytes), count, BATCH, WINDOW)
    finally:
        await client.close()


async def rstream_read(address: Address, stream: str, count: int) -> float:
    """Seconds rstream's Consumer takes to receive `count` decoded messages from first."""
    done = asyncio.Event()
    got = 0

    async def on_message(_message: AMQPMessage, _context: object) -> None:
        nonlocal got
        got += 1
        if got == count:
            done.set()

    host, port = address
    async with Consumer(host, port, username="guest", password="guest") as consumer:
        started = time.perf_counter()
        spec = ConsumerOffsetSpecification(OffsetType.FIRST)
        await consumer.subscribe(
            stream, on_message, decoder=amqp_decoder, offset_specification=spec
        )
        await asyncio.wait_for(done.wait(), TIMEOUT_S)
        return time.perf_counter() - started


async def rbfly_read(address: Address, stream: str, count: int) -> float:
    """Seconds rbfly takes to yield `count` messages from first."""
    host, port = address
    client = streams_client(f"rabbitmq-stream://guest:guest@{host}:{port}/")
    got = 0

    async def read() -> None:
        nonlocal got
        async for _message in client.subscribe(stream, offset=Offset.FIRST):
            got += 1
            if got == count:
                break

    try:
        started = time.perf_counter()
        await asyncio.wait_for(read(), TIMEOUT_S)
        return time.perf_counter() - started
    finally:
        await client.disconnect()


async def readers_read(address: Address, stream: str, count: int) -> float:
    """Seconds until each of READERS connections has read `count` records from first."""
    clients = [await StreamClient.connect(*address) for _ in range(READERS)]
    try:
        started = time.perf_counter()
        await asyncio.gather(*(client.consume(stream, count, CREDIT) for client in clients))
        return time.perf_counter() - started
    finally:
        for client in clients:
            await client.close()


Read = Callable[[Address, str, int], Coroutine[Any, Any, float]]
READS: Final[dict[str, tuple[Read, int]]] = {
    "rstream, from first": (rstream_read, 1),
    "rbfly, from first": (rbfly_read, 1),
    f"{READERS} readers of one stream, aggregate": (readers_read, READERS),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages-16", type=int, default=300_000, help="16 B messages")
    parser.add_argument("--messages-1k", type=int, default=100_000, help="1 KiB messages")
    args = parser.parse_args()
    sizes = {16: args.messages_16, 1024: args.messages_1k}
    rates: dict[tuple[str, int, str], list[float]] = {}
    with (
        tempfile.TemporaryDirectory() as directory,
        started_brokers(Path(directory)) as (streamq, rabbitmq),
    ):
        brokers = {"streamq": streamq, "RabbitMQ": rabbitmq}
        for size, count in sizes.items():
            for name, address in brokers.items():
                stream = f"readers-{size}"
                asyncio.run(fill(address, stream, size, count))
                for _ in range(args.rounds):
                    for read, (function, readers) in READS.items():
                        seconds = asyncio.run(function(address, stream, count))
                        rates.setdefault((read, size, name), []).append(readers * count / seconds)
    print("| read | body | streamq msgs/s | RabbitMQ msgs/s | streamq/RabbitMQ |")
    print("|---|---|---|---|---|")
    for size in sizes:
        for read in READS:
            ours = statistics.median(rates[(read, size, "streamq")])
            theirs = statistics.median(rates[(read, size, "RabbitMQ")])
            print(f"| {read} | {size} B | {ours:,.0f} | {theirs:,.0f} | {ours / theirs:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
