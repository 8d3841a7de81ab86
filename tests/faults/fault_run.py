"""One fault run, as `make test` and `make chaos` do it: a FaultCluster, publishers and
consumers on every node throughout, a schedule of faults, then heal, drain and check.
The history is written to `history.jsonl` in the run's directory, so that a failing run
can be checked again and read."""

from __future__ import annotations

import bisect
import itertools
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pika

from tests.faults.checker import Verdict, check
from tests.faults.clients import (
    CONNECTION_ERRORS,
    Client,
    Consumer,
    Endpoint,
    Publisher,
    Recorder,
    StreamReader,
    drain,
    parameters,
    read_stream,
    stop_all,
)
from tests.faults.fault_cluster import Fault, FaultCluster
from tests.faults.history import Event, Publish, Tenure, write_history
from tests.faults.nemesis import IN_SYNC_TIMEOUT_S, SETTLE_TIMEOUT_S, Step, run_schedule

QUEUE: Final = "faults"
STREAM: Final = "faults-stream"
CLIENT_STOP_TIMEOUT_S: Final = 30.0
TAIL_S: Final = 2.0  # traffic after the heal, before the clients stop


@dataclass(frozen=True, slots=True)
class RunResult:
    verdict: Verdict
    events: list[Event]
    faults: list[Fault]
    history: Path
    seconds: float

    def report(self) -> str:
        kinds = Counter(f.kind for f in self.faults if f.kind not in ("settled", "resume"))
        injected = ", ".join(f"{kind} {count}" for kind, count in sorted(kinds.items()))
        longest: dict[str, float] = {}
        for name, gap in self.confirm_gaps():
            longest[name] = max(gap, longest.get(name, 0.0))
        gaps = ", ".join(f"{name} {gap:.1f} s" for name, gap in sorted(longest.items()))
        elected = Counter[str]()
        for name, count in self.lease_changes():
            elected[name] += count
        changes = ", ".join(f"{name} {count}" for name, count in sorted(elected.items()))
        return (
            f"{self.seconds:.0f} s, faults: {injected}\n{self.verdict.report()}\n"
            f"longest time without a confirm, per kind of fault: {gaps}\n"
            f"leaders elected (lease changes), per kind of fault: {changes}\n"
            f"history: {self.history}"
        )

    def lease_changes(self) -> list[tuple[str, int]]:
        """Per fault step, how many leases etcd granted while it ran and the cluster
        settled after it: the failovers it caused."""
        starts = sorted(e.start for e in self.events if isinstance(e, Tenure) and e.role == "lease")
        changes = []
        start = self.faults[0].at if self.faults else 0.0
        for fault in self.faults:
            if fault.kind != "settled":
                continue
            first, last = bisect.bisect(starts, start), bisect.bisect(starts, fault.at)
            changes.append((fault.target, last - first))
            start = fault.at
        return changes

    def confirm_gaps(self) -> list[tuple[str, float]]:
        """Per fault step, the longest time between two confirms (or the step's bounds)
        while it ran and the cluster settled after it: how long publishers waited."""
        answered = sorted(
            e.answered
            for e in self.events
            if isinstance(e, Publish) and e.outcome == "confirmed" and e.answered is not None
        )
        gaps = []
        start = self.faults[0].at if self.faults else 0.0
        for fault in self.faults:
            if fault.kind != "settled":
                continue
            first, last = bisect.bisect(answered, start), bisect.bisect(answered, fault.at)
            bounds = [start, *answered[first:last], fault.at]
            gaps.append((fault.target, max(b - a for a, b in itertools.pairwise(bounds))))
            start = fault.at
        return gaps


def fault_run(
    base: Path, steps: Iterable[Step], *, publishers: int = 2, consumers: int = 2
) -> RunResult:
    started = time.monotonic()
    with FaultCluster(base) as fc:
        endpoints = fc.endpoints()
        declare(endpoints)
        recorder = Recorder()
        clients: list[Client] = [
            *(Publisher(f"p{i}", turned(endpoints, i), QUEUE, recorder) for i in range(publishers)),
            *(
                Consumer(f"c{i}", turned(endpoints, i + 1), QUEUE, recorder)
                for i in range(consumers)
            ),
            Publisher("sp", turned(endpoints, 2), STREAM, recorder),
            StreamReader("sr", turned(endpoints, 1), STREAM, recorder),
        ]
        for client in clients:
            client.start()
        try:
            run_schedule(fc, steps)
            fc.network.heal()
            assert fc.cluster is not None
            fc.cluster.wait_in_sync(fc.nodes, IN_SYNC_TIMEOUT_S)
            time.sleep(TAIL_S)
        finally:
            stop_all(clients, CLIENT_STOP_TIMEOUT_S)
        remaining = [drain(endpoints, QUEUE), read_stream(endpoints, STREAM)]
        events = [*recorder.events, *remaining, *fc.tenures()]
        history = base / "history.jsonl"
        write_history(history, events)
        seconds = time.monotonic() - started
        return RunResult(check(events), events, list(fc.faults), history, seconds)


def turned(endpoints: list[Endpoint], by: int) -> list[Endpoint]:
    """The endpoints starting from the `by`-th: clients spread over the nodes."""
    by %= len(endpoints)
    return endpoints[by:] + endpoints[:by]


def declare(endpoints: list[Endpoint]) -> None:
    """The durable queue and the stream, declared through whichever node answers
    (bounded)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        for endpoint in endpoints:
            try:
                connection = pika.BlockingConnection(parameters(endpoint))
            except CONNECTION_ERRORS:
                continue
            try:
                channel = connection.channel()
                channel.queue_declare(QUEUE, durable=True)
                channel.queue_declare(STREAM, durable=True, arguments={"x-queue-type": "stream"})
                return
            finally:
                connection.close()
        if time.monotonic() > deadline:
            raise TimeoutError(f"no node declared {QUEUE} within {SETTLE_TIMEOUT_S} s")
        time.sleep(0.2)
