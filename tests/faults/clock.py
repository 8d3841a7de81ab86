"""A node's wall clock, stepped by the test without touching the host's: each node of the
fault suite runs under libfaketime (Debian's `libfaketime`), which takes the node's
offset from a file of its own (FAKETIME_TIMESTAMP_FILE, "+0" or "+3600" or "-3600") and,
with FAKETIME_NO_CACHE=1, reads it again at every wall-clock read, so that a step takes
effect at once (a cached offset lags by up to two seconds: the log times could then not
be mapped back to host times exactly; reading the file costs about 15 us per read of the
wall clock, nothing the suite's rates notice).

What moves is the wall clock only (CLOCK_REALTIME: `time.time()`, the log's timestamps,
message timestamps), as a real step does (an NTP step, `date -s`):
FAKETIME_DONT_FAKE_MONOTONIC=1 leaves CLOCK_MONOTONIC alone, which never jumps on a real
machine; faking it too would test a fault that cannot happen (a monotonic clock going
back) and hide the one that can (a lease timed on the wall clock). NO_FAKE_STAT=1 leaves
file times as the kernel stamped them.

Two traps of libfaketime 0.9.10 with DONT_FAKE_MONOTONIC, found trying it on the broker:
- its "monotonic fix" for pthread_cond_timedwait (on by default) made a node's start-up
  take 3 to 14 s instead of 0.2 s, the event loop starved while a worker thread ran
  (the elected leader then missed its lease keepalives: "no keepalive succeeded within
  2.0 s"); CPython's GIL hand-over is a timed wait on a CLOCK_MONOTONIC condition
  variable, which that fix mistimes. FAKETIME_FORCE_MONOTONIC_FIX=0 turns it off: start-up
  as without libfaketime;
- clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME) fails with EINVAL, hence `time.sleep()`
  raises; the broker never sleeps that way (asyncio waits in epoll), and a crash there
  would show in the run.

The node's log times are its own wall clock: `host_time` maps them back with the steps
recorded here, for the writes tenures the checker compares with etcd's.
"""

from __future__ import annotations

import glob
import os
import time
from pathlib import Path
from typing import Final

# The thread-safe build (the broker reads the clock from its fsync and hashing threads).
LIBRARY_PATTERN: Final = "/usr/lib/*/faketime/libfaketimeMT.so.1"


def library() -> str:
    """The path of libfaketime; AssertionError naming the package when it is missing."""
    found = sorted(glob.glob(LIBRARY_PATTERN))
    assert found, (
        "libfaketime is missing: apt-get install libfaketime (tools/install-system-packages.sh)"
    )
    return found[0]


class NodeClock:
    """The wall-clock offset of one node, in the file at `path` (created at +0)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.library = library()
        self.offset_s = 0
        # (host time from which it held, offset in seconds), in order. The first span
        # starts now, not at 0: from 0 it would hold every reading of a clock stepped
        # back, which `host_time` would then map to an hour early.
        self.steps: list[tuple[float, int]] = [(time.time(), 0)]
        self._write(0)

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv` run under libfaketime with this clock (`env` execs it: same pid)."""
        return [
            "env",
            f"LD_PRELOAD={self.library}",
            f"FAKETIME_TIMESTAMP_FILE={self.path}",
            "FAKETIME_NO_CACHE=1",
            "FAKETIME_DONT_FAKE_MONOTONIC=1",
            "FAKETIME_FORCE_MONOTONIC_FIX=0",
            "NO_FAKE_STAT=1",
            *argv,
        ]

    def step(self, offset_s: int) -> None:
        """From now on the node's wall clock reads host time + `offset_s`."""
        self._write(offset_s)
        self.offset_s = offset_s
        self.steps.append((time.time(), offset_s))

    def host_time(self, node_time: float) -> float:
        """The host time at which the node's wall clock read `node_time`: the reading
        less the offset of the step whose span it falls in (steps of an hour are far
        apart enough for only one to fit; the nearest span when none does, at a step's
        edge)."""
        best, best_distance = node_time, float("inf")
        for index, (start, offset) in enumerate(self.steps):
            end = self.steps[index + 1][0] if index + 1 < len(self.steps) else float("inf")
            candidate = node_time - offset
            distance = max(start - candidate, candidate - end, 0.0)
            if distance < best_distance:
                best, best_distance = candidate, distance
        return best

    def _write(self, offset_s: int) -> None:
        """Replace the file whole (a rename: libfaketime never reads half of it)."""
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(f"{offset_s:+d}\n")
        os.replace(temporary, self.path)
