"""The fault suite's checker: reads a run's history (tests/faults/history.py) and says
which of the broker's promises it breaks. The rules, per queue and stream:

- `lost`: a confirmed message is gone. A queue's must have been acked by a consumer or
  still be in the queue after heal; a stream's must have been read by a consumer or still
  be in the stream.
- `unexpected`: something was delivered, or is still held, that was never published to
  that target.
- `unflagged`: a queue delivered a message again without setting `redelivered`: more
  than one delivery of it without the flag, or one that reached its consumer after
  another delivery of it and cannot be the broker's first one arriving late (see
  `_late_first`).
- `duplicates`: more repeat deliveries (flagged ones, and acked messages still held after
  heal) than the run allows (`duplicates_max`): at-least-once is not unbounded.
- `stored_twice`: a stream holds one message at two offsets.
- `offset_mismatch`: a stream consumer read a message at an offset where the stream, after
  heal, holds another one (two nodes' logs diverged and both served).
- `order`: a publisher's confirmed messages sit in a stream out of the order it published
  them in.
- `unfenced`: a node confirmed a publish although it held no lease at any moment between
  the publish and the confirm (checked when the history records leases).
- `two_writers`: two nodes accepted writes at the same time.

The checker is itself tested against histories that break each rule
(tests/faults/test_checker.py): a checker that misses a violation proves nothing.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from tests.faults.history import Ack, Delivery, Event, Publish, Remaining, Tenure

DUPLICATES_MAX: Final = 1000  # repeat deliveries a run may see (each one flagged)
SHOWN_MAX: Final = 20  # violations kept per rule, for the report; all are counted

Key = tuple[str, str]  # (target, message)


@dataclass(slots=True)
class Verdict:
    """What the checker found: counts of what the history holds, and per rule the
    violations (a few examples each, `counts` has them all)."""

    publishes: int = 0
    confirmed: int = 0
    deliveries: int = 0
    acks: int = 0
    repeats: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    @property
    def ok(self) -> bool:
        return not self.counts

    def violate(self, rule: str, detail: str) -> None:
        self.counts[rule] += 1
        if len(self.examples[rule]) < SHOWN_MAX:
            self.examples[rule].append(detail)

    def report(self) -> str:
        """One paragraph for a test's failure message or the soak's summary."""
        head = (
            f"{self.publishes} publishes ({self.confirmed} confirmed), {self.deliveries} "
            f"deliveries, {self.acks} acks, {self.repeats} repeat deliveries"
        )
        if self.ok:
            return head + ": no violation"
        lines = [head + ":"]
        for rule, count in sorted(self.counts.items()):
            lines.append(f"  {rule}: {count}, e.g. " + "; ".join(self.examples[rule]))
        return "\n".join(lines)


@dataclass(slots=True)
class _Seen:
    """The history sorted by what the rules look up."""

    published: dict[Key, list[Publish]] = field(default_factory=lambda: defaultdict(list))
    deliveries: dict[Key, list[Delivery]] = field(default_factory=lambda: defaultdict(list))
    acked: set[Key] = field(default_factory=set)
    remaining: dict[str, Remaining] = field(default_factory=dict)
    tenures: list[Tenure] = field(default_factory=list)


def check(events: Iterable[Event], *, duplicates_max: int = DUPLICATES_MAX) -> Verdict:
    """The verdict on a history (any order of events)."""
    seen = _sort(events)
    verdict = Verdict(
        publishes=sum(len(p) for p in seen.published.values()),
        confirmed=sum(1 for p in seen.published.values() for x in p if x.outcome == "confirmed"),
        deliveries=sum(len(d) for d in seen.deliveries.values()),
        acks=len(seen.acked),
    )
    held = _held(seen)
    _check_lost(seen, held, verdict)
    _check_unexpected(seen, held, verdict)
    _check_repeats(seen, held, verdict)
    if verdict.repeats > duplicates_max:
        verdict.violate("duplicates", f"{verdict.repeats} repeat deliveries > {duplicates_max}")
    for remaining in seen.remaining.values():
        if remaining.kind == "stream":
            _check_stream(seen, remaining, verdict)
    _check_fencing(seen, verdict)
    _check_writers(seen.tenures, verdict)
    return verdict


def _sort(events: Iterable[Event]) -> _Seen:
    seen = _Seen()
    for event in events:
        if isinstance(event, Publish):
            seen.published[event.target, event.message].append(event)
        elif isinstance(event, Delivery):
            seen.deliveries[event.target, event.message].append(event)
        elif isinstance(event, Ack):
            seen.acked.add((event.target, event.message))
        elif isinstance(event, Remaining):
            if event.target in seen.remaining:
                raise ValueError(f"two final reads of {event.target!r}")
            seen.remaining[event.target] = event
        else:
            seen.tenures.append(event)
    return seen


def _held(seen: _Seen) -> set[Key]:
    return {(r.target, m) for r in seen.remaining.values() for m in r.messages}


def _is_stream(seen: _Seen, target: str) -> bool:
    remaining = seen.remaining.get(target)
    return remaining is not None and remaining.kind == "stream"


def _check_lost(seen: _Seen, held: set[Key], verdict: Verdict) -> None:
    for key, publishes in seen.published.items():
        if not any(p.outcome == "confirmed" for p in publishes):
            continue
        target, message = key
        if key in held:
            continue
        if _is_stream(seen, target) and key in seen.deliveries:
            continue
        if not _is_stream(seen, target) and key in seen.acked:
            continue
        verdict.violate("lost", f"{message} in {target}")


def _check_unexpected(seen: _Seen, held: set[Key], verdict: Verdict) -> None:
    for target, message in sorted(held | seen.deliveries.keys()):
        if (target, message) not in seen.published:
            verdict.violate("unexpected", f"{message} in {target}")


def _check_repeats(seen: _Seen, held: set[Key], verdict: Verdict) -> None:
    """Queues only: a stream's consumers may read an offset again at will."""
    for key, deliveries in seen.deliveries.items():
        target, message = key
        if _is_stream(seen, target):
            continue
        in_order = sorted(deliveries, key=lambda d: d.at)
        verdict.repeats += len(in_order) - 1
        unflagged = [d for d in in_order if not d.redelivered]
        for again in unflagged[1:]:
            verdict.violate("unflagged", f"{message} in {target} to {again.consumer} again")
        if unflagged and unflagged[0] is not in_order[0]:
            first = unflagged[0]
            if not _late_first(seen, first, in_order[: in_order.index(first)]):
                verdict.violate(
                    "unflagged", f"{message} in {target} to {first.consumer} after a delivery"
                )
        if key in seen.acked and key in held:
            verdict.repeats += 1  # acked, and back after heal: it will be delivered again


def _late_first(seen: _Seen, delivery: Delivery, earlier: list[Delivery]) -> bool:
    """Whether `delivery` (without the flag, received after the `earlier` deliveries of
    its message) can be the broker's first delivery of it, held up in the network: sent
    before its connection broke, received after the broker had given that connection
    up, requeued the message and delivered it again.

    Then the broker sent nothing on that connection after giving it up, which was before
    the earlier deliveries: none of them came on it, and every delivery on it from this
    one on is of a message published before the first of them. A delivery there of a
    message published later shows a connection the broker still served. Unknowable
    (False) without the connection (`session`), as in histories from before it was
    recorded."""
    connection = (delivery.consumer, delivery.session)
    if delivery.session is None or any((d.consumer, d.session) == connection for d in earlier):
        return False
    redelivered_at = earlier[0].at
    for (target, message), deliveries in seen.deliveries.items():
        if target != delivery.target:
            continue
        for other in deliveries:
            if (other.consumer, other.session) != connection or other.at < delivery.at:
                continue
            if _published_at(seen, target, message) >= redelivered_at:
                return False
    return True


def _published_at(seen: _Seen, target: str, message: str) -> float:
    """When `message` was first sent to `target` (infinity if never)."""
    publishes = seen.published.get((target, message))
    return min(p.sent for p in publishes) if publishes else float("inf")


def _check_stream(seen: _Seen, remaining: Remaining, verdict: Verdict) -> None:
    target = remaining.target
    if len(remaining.offsets) != len(remaining.messages):
        raise ValueError(f"the final read of stream {target!r} has no offset for each message")
    at: dict[int, str] = {}
    where: dict[str, int] = {}
    for offset, message in zip(remaining.offsets, remaining.messages, strict=True):
        at[offset] = message
        if message in where:
            verdict.violate("stored_twice", f"{message} in {target} at {where[message]}, {offset}")
        else:
            where[message] = offset
    for (delivered_to, message), deliveries in seen.deliveries.items():
        if delivered_to != target:
            continue
        for delivery in deliveries:
            held = at.get(delivery.offset) if delivery.offset is not None else None
            if held is not None and held != message:
                verdict.violate(
                    "offset_mismatch", f"{target} offset {delivery.offset}: {message}, now {held}"
                )
    _check_order(seen, target, where, verdict)


def _check_order(seen: _Seen, target: str, where: dict[str, int], verdict: Verdict) -> None:
    by_publisher: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    for (published_to, message), publishes in seen.published.items():
        offset = where.get(message)
        if published_to != target or offset is None:
            continue
        for publish in publishes:
            if publish.outcome == "confirmed":
                by_publisher[publish.publisher].append((publish.sequence, offset, message))
    for publisher, stored in by_publisher.items():
        stored.sort()
        for (_, before, first), (_, after, second) in itertools.pairwise(stored):
            if after < before:
                verdict.violate(
                    "order", f"{publisher} in {target}: {second} at {after} before {first}"
                )


def _check_fencing(seen: _Seen, verdict: Verdict) -> None:
    leases: dict[str, list[Tenure]] = defaultdict(list)
    for tenure in seen.tenures:
        if tenure.role == "lease":
            leases[tenure.node].append(tenure)
    if not leases:
        return  # a run without leases (one node)
    for publishes in seen.published.values():
        for publish in publishes:
            if publish.outcome != "confirmed":
                continue
            answered = publish.sent if publish.answered is None else publish.answered
            if not any(_overlaps(t, publish.sent, answered) for t in leases[publish.node]):
                verdict.violate(
                    "unfenced",
                    f"{publish.node} confirmed {publish.message} at {answered:.3f} without a lease",
                )


def _overlaps(tenure: Tenure, start: float, end: float) -> bool:
    return tenure.start <= end and (tenure.end is None or tenure.end >= start)


def _check_writers(tenures: list[Tenure], verdict: Verdict) -> None:
    """Sweeps the writes tenures by start: each must end before the next one starts,
    unless both are the same node's."""
    writes = sorted((t for t in tenures if t.role == "writes"), key=lambda t: t.start)
    latest: Tenure | None = None  # the tenure that ends last among those started so far
    for tenure in writes:
        if latest is not None and latest.node != tenure.node and not _ended_by(latest, tenure):
            verdict.violate("two_writers", f"{latest.node} and {tenure.node} at {tenure.start:.3f}")
        if latest is None or _ends_later(tenure, latest):
            latest = tenure


def _ended_by(tenure: Tenure, next_one: Tenure) -> bool:
    return tenure.end is not None and tenure.end <= next_one.start


def _ends_later(tenure: Tenure, other: Tenure) -> bool:
    if other.end is None:
        return False
    return tenure.end is None or tenure.end > other.end
