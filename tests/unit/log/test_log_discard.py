"""`SegmentLog.discard` (a stream deleted) while a sync round is in flight on the Syncer
thread: the files are released after the round, not under it. Released at once, the
round's completion closed descriptors already closed (EBADF in an event-loop callback)
and the round itself fdatasynced and wrote the durable offset through numbers that the
next file opened could have reused (found reading the code behind fuzz finding 4,
docs/fuzzing.md)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from streamq.log.errors import LogClosed
from streamq.log.log import LogConfig, SegmentLog
from streamq.log.syncer import Syncer
from tests.unit.log.conftest import message

ROUNDS = 40


async def _discard_during_rounds(tmp_path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    loop = asyncio.get_running_loop()
    handler_calls: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: handler_calls.append(context))
    syncer = Syncer(direct_io=False)
    outcomes: list[str] = []
    try:
        for i in range(ROUNDS):
            directory = str(tmp_path / f"log-{i}")
            log = SegmentLog.open(directory, LogConfig(segment_bytes_max=4096), syncer)
            for n in range(40):  # several segments: the round seals some
                log.append([message(n, 300)], 1)
            syncing = asyncio.ensure_future(log.sync())
            for _ in range(i % 4):  # the discard at different points of the round
                await asyncio.sleep(0)
            log.discard()
            try:
                await asyncio.wait_for(syncing, 10)
                outcomes.append("synced")
            except LogClosed:
                outcomes.append("closed")
            await asyncio.sleep(0)  # the release after the round
            await asyncio.wrap_future(syncer.barrier())  # the writers close on its thread
            # Every descriptor of the log is closed, each once.
            assert not [p for p in _open_paths() if p.startswith(directory + "/")]
    finally:
        syncer.close()
    return handler_calls, outcomes


def _open_paths() -> list[str]:
    paths = []
    for name in os.listdir("/proc/self/fd"):
        try:
            paths.append(os.readlink(f"/proc/self/fd/{name}"))
        except OSError:
            continue
    return paths


def test_a_discard_during_a_round_releases_after_it(tmp_path: Path) -> None:
    handler_calls, outcomes = asyncio.run(_discard_during_rounds(tmp_path))
    assert handler_calls == []  # was: OSError EBADF in the round's completion callback
    assert set(outcomes) <= {"synced", "closed"}
    assert "closed" in outcomes  # the discard did land during rounds
