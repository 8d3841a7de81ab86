"""The work-queue scenarios of `benchmarks/compare.py` (issue 30, items 1 and 3): one
publisher and many consumers on one queue, each consumer a process with a connection of
its own (as worker processes are), acking each message with its own basic.ack, at
prefetch 1000 and at prefetch 1 (the work-queue tutorial's fair dispatch); and a queue
whose messages carry a per-message `expiration`.
"""

from __future__ import annotations

from typing import Final

from benchmarks.scenarios import CONSUME, PUBLISH, Scenario, timed

CONSUMER_COUNTS: Final = (4, 16, 64)
PREFETCHES: Final = (1000, 1)
TTL_CONSUMERS: Final = 4
EXPIRATION_MS: Final = 60_000
"""Long enough that nothing expires in a run: the row measures the delivery path."""


def work_queue_scenarios() -> list[Scenario]:
    """`wq-N-pP`: 1 publisher and N consumers on one queue at prefetch P, per-message
    acks; `ttl-each`: the same with TTL_CONSUMERS consumers, every message with an
    expiration."""
    scenarios = []
    for prefetch in PREFETCHES:
        for consumers in CONSUMER_COUNTS:
            flags = f"-x 1 -y {consumers} --ack-each -P {prefetch} -s 16"
            title = f"1 pub + {consumers} cons, one queue, prefetch {prefetch}, per-message acks"
            scenarios.append(
                Scenario(
                    f"wq-{consumers}-p{prefetch}", title, flags, (PUBLISH, CONSUME), timed(flags)
                )
            )
    flags = f"-x 1 -y {TTL_CONSUMERS} --ack-each -P 1000 -s 16 --expiration {EXPIRATION_MS}"
    title = f"1 pub + {TTL_CONSUMERS} cons, per-message expiration, prefetch 1000, per-message acks"
    scenarios.append(Scenario("ttl-each", title, flags, (PUBLISH, CONSUME), timed(flags)))
    return scenarios
