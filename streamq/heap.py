"""The broker process's heap: CPython's cyclic garbage collector setting, and handing
freed memory back to the kernel.

CPython collects its youngest generation after every 700 allocations of objects that can
hold references, and a publish allocates several (the scanner's message tuple, the event).
At a few hundred thousand messages a second that is a collection every millisecond or so:
40% of the publish path's CPU with 16-byte messages, when the queued messages were still
tracked and every older collection scanned them again (docs/perf.md, "Publish runs, C
modules and the collector"). The stored message is now a C type the collector does not
track (`broker/_message.c`; docs/perf.md, "Collector pauses").

`streamq serve` raises the young threshold to `YOUNG_THRESHOLD`: a young collection then
scans at most that many objects, 70 times less often. The older generations keep
CPython's rules, so reference cycles are freed as before. A process
that embeds the broker (the tests) keeps its own settings.

glibc keeps what the process frees for its own later use: only free memory at the top of
a heap goes back to the kernel by itself, so the read buffers, frames and log tails of a
run, freed amid the heap, stayed in the RSS of an idle broker. `return_freed_memory`
asks for it back (`malloc_trim`); the log calls it after releasing its tail, and
`RestTrim` once each time the process comes to rest (docs/perf.md, "Memory at rest").
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import time
from collections.abc import Callable
from typing import Final

YOUNG_THRESHOLD: Final = 50_000
# The process is at rest over an interval in which it used less CPU than this share of
# it (an idle broker uses about 0.1%: its housekeeping timer).
REST_TRIM_INTERVAL_S: Final = 1.0
REST_CPU_SHARE_MAX: Final = 0.02


def tune_collector() -> tuple[int, int, int]:
    """Apply the broker's thresholds; returns the previous ones."""
    previous = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, previous[1], previous[2])
    return previous


_malloc_trim: list[Callable[[int], int] | None] = []  # looked up on first use


def return_freed_memory() -> bool:
    """Ask the C allocator to hand the free pages of its heaps back to the kernel
    (glibc's `malloc_trim(0)`, which returns free pages amid a heap too, not only at its
    top). Takes 0.1-0.3 ms on an idle broker's heap, up to about 12 ms the first time
    after start-up. False where the C library has no such call (not glibc)."""
    if not _malloc_trim:
        try:
            function = ctypes.CDLL(None).malloc_trim
        except (AttributeError, OSError):
            _malloc_trim.append(None)
        else:
            function.argtypes, function.restype = [ctypes.c_size_t], ctypes.c_int
            _malloc_trim.append(function)
    trim = _malloc_trim[0]
    if trim is None:
        return False
    trim(0)
    return True


class RestTrim:
    """Every `interval_s`, returns freed memory to the kernel once if the process was at
    rest over the last interval and has not done so since it was last busy: a busy
    broker would only fault the pages back in."""

    def __init__(
        self,
        interval_s: float = REST_TRIM_INTERVAL_S,
        *,
        cpu_s: Callable[[], float] = time.process_time,
        trim: Callable[[], bool] = return_freed_memory,
    ) -> None:
        self.interval_s = interval_s
        self._cpu_s = cpu_s
        self._trim = trim
        self._cpu_last_s = cpu_s()
        self._trimmed = False
        self._timer: asyncio.TimerHandle | None = None
        self.trims = 0

    def start(self) -> None:
        """Check every `interval_s` on the running loop until `stop`."""
        self._timer = asyncio.get_running_loop().call_later(self.interval_s, self._tick)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def check(self) -> bool:
        """One interval's check; whether it trimmed."""
        cpu_s = self._cpu_s()
        busy = cpu_s - self._cpu_last_s >= REST_CPU_SHARE_MAX * self.interval_s
        self._cpu_last_s = cpu_s
        if busy:
            self._trimmed = False
            return False
        if self._trimmed:
            return False
        self._trimmed = True
        self.trims += 1
        self._trim()
        return True

    def _tick(self) -> None:
        self.check()
        self.start()
