"""Child process of test_log_kill: appends and syncs forever, printing each durable offset.

Bodies are derived from their offset (`body_for`), so the parent can check content after
a SIGKILL without knowing what the child wrote. Usage: log_kill_child.py DIR SEED MODE,
where MODE is `blocking` (sync_blocking) or `async` (concurrent tasks sharing rounds).
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import sys

from streamq.log.format import Message
from streamq.log.log import LogConfig, SegmentLog

CONFIG = LogConfig(segment_bytes_max=64 * 1024, index_interval_bytes=1024)


def body_for(offset: int) -> bytes:
    digest = hashlib.sha256(str(offset).encode()).digest()
    return digest * (offset % 64 + 1)  # 32 B .. 2 KiB


def message_for(offset: int) -> Message:
    return Message(b"ex", str(offset).encode(), b"", body_for(offset))


def run_blocking(log: SegmentLog, rng: random.Random) -> None:
    while True:
        first = log.next_offset
        count = rng.randint(1, 200)
        log.append([message_for(first + i) for i in range(count)], 1)
        print(log.sync_blocking(), flush=True)


async def run_async(log: SegmentLog, rng: random.Random) -> None:
    async def writer() -> None:
        while True:
            first = log.next_offset
            count = rng.randint(1, 50)
            log.append([message_for(first + i) for i in range(count)], 1)
            print(await log.sync(), flush=True)

    await asyncio.gather(*(writer() for _ in range(8)))


def main() -> None:
    directory, seed, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    log = SegmentLog.open(directory, CONFIG)
    rng = random.Random(seed)
    if mode == "async":
        asyncio.run(run_async(log, rng))
    else:
        run_blocking(log, rng)


if __name__ == "__main__":
    main()
