"""The Syncer's round gate: a round's future completes only when the gate releases it.

Method: a gate that records each round's `done` and releases or fails them on demand;
the Syncer's futures are checked before and after.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from streamq.log.errors import ReplicationFenced
from streamq.log.log import LogConfig, SegmentLog
from streamq.log.syncer import Syncer

WAIT_S = 10.0


class RecordingGate:
    def __init__(self) -> None:
        self.held: list[Callable[[BaseException | None], None]] = []
        self.threads: list[str] = []
        self.arrived = threading.Semaphore(0)

    def hold(self, done: Callable[[BaseException | None], None]) -> None:
        self.threads.append(threading.current_thread().name)
        self.held.append(done)
        self.arrived.release()


def test_rounds_wait_for_the_gate_and_the_thread_does_not() -> None:
    syncer = Syncer()
    gate = RecordingGate()
    syncer.gate = gate
    try:
        first = syncer.submit(lambda: "first")
        second = syncer.barrier()
        # Both rounds ran on the fsync thread: the gate held the first without blocking it.
        assert gate.arrived.acquire(timeout=WAIT_S)
        assert gate.arrived.acquire(timeout=WAIT_S)
        assert gate.threads == ["streamq-fsync_0", "streamq-fsync_0"]
        assert not first.done() and not second.done()
        gate.held[1](None)  # released from another thread, in any order
        assert second.result(WAIT_S) is None
        assert not first.done()
        gate.held[0](None)
        assert first.result(WAIT_S) == "first"
    finally:
        syncer.close()


def test_a_fenced_round_fails_and_a_failing_round_skips_the_gate() -> None:
    syncer = Syncer()
    gate = RecordingGate()
    syncer.gate = gate
    try:
        held = syncer.submit(lambda: 1)
        assert gate.arrived.acquire(timeout=WAIT_S)
        gate.held[0](ReplicationFenced())
        with pytest.raises(ReplicationFenced, match="no longer the cluster leader"):
            held.result(WAIT_S)

        def broken() -> None:
            raise OSError("disk")

        failed = syncer.submit(broken)
        with pytest.raises(OSError, match="disk"):
            failed.result(WAIT_S)
        assert len(gate.held) == 1  # a round that failed never reaches the gate
    finally:
        syncer.close()


def test_without_a_gate_rounds_complete_on_the_thread() -> None:
    syncer = Syncer()
    try:
        assert syncer.submit(lambda: 7).result(WAIT_S) == 7
        assert syncer.barrier().result(WAIT_S) is None
    finally:
        syncer.close()
    with pytest.raises(RuntimeError):
        syncer.barrier()


def test_a_cancelled_held_round_stays_cancelled() -> None:
    syncer = Syncer()
    gate = RecordingGate()
    syncer.gate = gate
    try:
        held = syncer.submit(lambda: 1)
        assert gate.arrived.acquire(timeout=WAIT_S)
        assert held.cancel()
        gate.held[0](None)  # the gate's release finds it cancelled: no error
        assert held.cancelled()
        with pytest.raises(concurrent.futures.CancelledError):
            held.result(0)
    finally:
        syncer.close()


def test_closing_a_log_whose_round_is_fenced_returns_without_raising(tmp_path: Path) -> None:
    """A leader steps down while a round is in flight: close() awaits that round, which
    fails with ReplicationFenced itself (not a LogFailed), and must still return."""

    async def scenario() -> None:
        syncer = Syncer()
        gate = RecordingGate()
        syncer.gate = gate
        log = SegmentLog.open(str(tmp_path), LogConfig(), syncer)
        try:
            log.append_one(b"", b"q", b"", b"unconfirmed", 1)
            waiting = asyncio.create_task(log.sync())
            while not gate.held:
                await asyncio.sleep(0.01)
            closing = asyncio.create_task(log.close())
            await asyncio.sleep(0.05)
            assert not closing.done()  # it waits for the round in flight
            gate.held[0](ReplicationFenced())
            await asyncio.wait_for(closing, WAIT_S)  # returns: no exception
            with pytest.raises(ReplicationFenced):
                await waiting  # the publisher's wait fails: nothing is confirmed
        finally:
            syncer.close()

    asyncio.run(scenario())


def test_the_next_round_runs_while_the_replicas_catch_up_with_the_last(tmp_path: Path) -> None:
    """Pipelined rounds in a cluster: a second round starts (and reaches the gate) while
    the first is held, and each round's records become durable only when it is released."""

    async def until(condition: Callable[[], bool]) -> None:
        for _ in range(int(WAIT_S / 0.01)):
            if condition():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("timed out")

    async def scenario() -> None:
        syncer = Syncer()
        gate = RecordingGate()
        syncer.gate = gate
        log = SegmentLog.open(str(tmp_path), LogConfig(), syncer)
        try:
            log.append_one(b"", b"q", b"", b"first", 1)
            first = asyncio.create_task(log.sync())
            await until(lambda: len(gate.held) == 1)
            log.append_one(b"", b"q", b"", b"second", 2)
            second = asyncio.create_task(log.sync())
            await until(lambda: len(gate.held) == 2)  # ran while the first was held
            assert not first.done() and not second.done()
            assert log.read(0, 10) == []  # nothing durable before the replicas have it
            gate.held[0](None)
            assert await asyncio.wait_for(first, WAIT_S) == 1
            assert [r.body for r in log.read(0, 10)] == [b"first"]
            assert not second.done()
            gate.held[1](None)
            assert await asyncio.wait_for(second, WAIT_S) == 2
            assert [r.body for r in log.read(0, 10)] == [b"first", b"second"]
        finally:
            syncer.gate = None  # close()'s own round needs no replica
            await log.close()
            syncer.close()

    asyncio.run(scenario())
