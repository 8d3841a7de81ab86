"""The broker process's setting of CPython's cyclic garbage collector.

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
"""

from __future__ import annotations

import gc
from typing import Final

YOUNG_THRESHOLD: Final = 50_000


def tune_collector() -> tuple[int, int, int]:
    """Apply the broker's thresholds; returns the previous ones."""
    previous = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, previous[1], previous[2])
    return previous
