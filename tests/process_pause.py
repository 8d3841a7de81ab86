"""SIGSTOP that returns once the process is stopped: the tests' pauses.

`os.kill(pid, SIGSTOP)` returns before the target has stopped: each of its threads stops
when the kernel next runs it, so on a loaded machine a request sent right after the kill
can still be answered (a test saw etcd answer a read after its pause). `pause` waits
until every thread of the process shows the stopped state in /proc.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Final

STOPPED_TIMEOUT_S: Final = 5.0
POLL_S: Final = 0.005
STOPPED_STATES: Final = frozenset({"T", "t"})  # stopped, or stopped by a tracer


def pause(pid: int) -> None:
    """SIGSTOP `pid` and wait (bounded) until all of its threads are stopped."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + STOPPED_TIMEOUT_S
    while not _all_stopped(pid):
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} not stopped {STOPPED_TIMEOUT_S} s after SIGSTOP")
        time.sleep(POLL_S)


def _all_stopped(pid: int) -> bool:
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return True  # gone: nothing runs
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as stat:
                state = stat.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that exited
        if state not in STOPPED_STATES and state != "Z":
            return False
    return True
