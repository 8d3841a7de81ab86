"""A vhost closes with queues declared while it closes (regression of a fuzz finding,
docs/fuzzing.md: the management API's fuzz soak renews its broker while requests are in
flight, and the close iterated the vhost's queues across its awaits: "dictionary changed
size during iteration", the broker's close failing half way)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from streamq.broker.broker import Broker
from streamq.broker.definitions_import import Importer


def queues(names: list[str], stream: bool = False) -> dict[str, object]:
    arguments = {"x-queue-type": "stream"} if stream else {}
    return {
        "queues": [
            {"name": name, "vhost": "/", "durable": True, "arguments": arguments} for name in names
        ]
    }


async def test_queues_declared_during_the_close_do_not_break_it(tmp_path: Path) -> None:
    broker = Broker(str(tmp_path / "data"), direct_io=False)
    await Importer(broker, queues([f"s{n}" for n in range(4)], stream=True), None).run()
    closing = asyncio.create_task(broker.aclose())

    async def declare_later(n: int) -> None:
        # Spread over the close's awaits (each stream log's close is one).
        for _ in range(n):
            await asyncio.sleep(0)
        await Importer(broker, queues([f"late{n}"]), None).run()

    late = [asyncio.create_task(declare_later(n)) for n in range(200)]
    results = await asyncio.gather(closing, *late, return_exceptions=True)
    assert not isinstance(results[0], BaseException), repr(results[0])
