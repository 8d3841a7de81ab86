"""The broker process's policy for CPython's cyclic garbage collector.

A broker holds millions of long-lived objects (a `StoredMessage` per queued message, the
cursors' entries) that never form reference cycles. Left alone, the collector scans them
again and again: a full collection whenever the old generation has grown by a quarter,
each one over the whole heap. With a growing queue that took 20-30% of the publish
path's CPU (docs/perf.md, "Garbage collector"). So the broker process:

- moves the objects that survived so far to the permanent generation every
  `FREEZE_INTERVAL_S` (`gc.freeze()`), so that no automatic collection scans them again;
  reference counting still frees each one when its last reference goes, as before;
- every `SWEEP_INTERVAL_S` runs one full collection over everything (`gc.unfreeze()`,
  `gc.collect()`), which frees the cycles that were frozen while alive (a closed
  connection's objects, say). It pauses the event loop for about 0.13 s per million
  queued messages here; the default collector paused as long, more often.

Young objects are collected automatically, as by default. The policy runs in `streamq
serve` only, not in a process that embeds the broker (the tests).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from typing import Final

FREEZE_INTERVAL_S: Final = 1.0
SWEEP_INTERVAL_S: Final = 300.0
# Allocations of tracked objects between two young collections (CPython's default: 700).
YOUNG_THRESHOLD: Final = 50_000

logger = logging.getLogger(__name__)


class HeapPolicy:
    """Decides, at each tick, whether to sweep; then freezes what survived."""

    def __init__(self, now_s: float) -> None:
        self.next_sweep_s = now_s + SWEEP_INTERVAL_S
        self.sweeps = 0

    def tick(self, now_s: float) -> None:
        if now_s >= self.next_sweep_s:
            started = time.monotonic()
            gc.unfreeze()
            freed = gc.collect()
            self.sweeps += 1
            self.next_sweep_s = now_s + SWEEP_INTERVAL_S
            logger.debug(
                "heap sweep: %d unreachable objects, %.3f s", freed, time.monotonic() - started
            )
        gc.freeze()


async def keep_heap() -> None:
    """Apply the policy until cancelled (a task of `streamq serve`)."""
    policy = HeapPolicy(time.monotonic())
    thresholds = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, thresholds[1], thresholds[2])
    try:
        while True:
            policy.tick(time.monotonic())
            await asyncio.sleep(FREEZE_INTERVAL_S)
    finally:
        gc.unfreeze()  # leave the interpreter as it was found
        gc.set_threshold(*thresholds)
