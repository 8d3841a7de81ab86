"""Crash safety of the log under SIGKILL: a child appends and syncs in a loop, printing
each offset that sync reported durable; the parent kills it at random moments, reopens
the same directory and checks that every reported offset is present and intact."""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamq.log.log import SegmentLog
from tests.integration.log_kill_child import CONFIG, message_for

CHILD = str(Path(__file__).with_name("log_kill_child.py"))
ROOT = str(Path(__file__).parents[2])


def run_and_kill(directory: Path, seed: int, mode: str, delay_s: float) -> int:
    """Start the child, let it run `delay_s` after it reported its first durable offset,
    SIGKILL it, and return the highest offset it reported durable."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    child = subprocess.Popen(
        [sys.executable, CHILD, str(directory), str(seed), mode],
        stdout=subprocess.PIPE,
        env=env,
    )
    assert child.stdout is not None
    reported = -1
    deadline = time.monotonic() + 20
    kill_at: float | None = None
    try:
        fd = child.stdout.fileno()
        pending = b""
        while kill_at is None or time.monotonic() < kill_at:
            assert time.monotonic() < deadline, "child made no progress"
            ready, _, _ = select.select([fd], [], [], 0.01)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            assert chunk, f"child exited with {child.poll()}"
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                reported = max(reported, int(line))
            if kill_at is None and reported >= 0:
                kill_at = time.monotonic() + delay_s
        os.kill(child.pid, signal.SIGKILL)
        # Lines already written before the kill are durable claims too.
        rest = pending + child.stdout.read()
        for line in rest.split(b"\n")[:-1]:
            reported = max(reported, int(line))
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=20)
        child.stdout.close()
    return reported


def check_log(directory: Path, durable_reported: int) -> int:
    log = SegmentLog.open(str(directory), CONFIG)
    try:
        assert log.next_offset >= durable_reported
        offset = log.start_offset
        while offset < log.next_offset:
            batch = log.read(offset, 1000)
            for record in batch:
                assert record.offset == offset
                expected = message_for(offset)
                assert (record.routing_key, record.body) == (expected.routing_key, expected.body)
                offset += 1
        assert log.append([message_for(log.next_offset)], 1) == offset
        log.sync_blocking()
        return log.next_offset
    finally:
        log.close_blocking()


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "kills"), [("blocking", 24), ("async", 8)])
def test_every_offset_reported_durable_survives_sigkill(
    tmp_path: Path, mode: str, kills: int
) -> None:
    rng = random.Random(20261122)
    highest = 0
    for kill in range(kills):
        reported = run_and_kill(tmp_path, kill, mode, rng.uniform(0.0, 0.25))
        highest = max(highest, reported)
        end = check_log(tmp_path, highest)
        assert end > highest
    assert highest > kills  # the children made real progress between kills
