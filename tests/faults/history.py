"""What a fault run saw, as the checker (tests/faults/checker.py) reads it: every publish
with its outcome, every delivery and ack, what each queue and stream still held after
the faults were healed, and when each node held the leader's lease and accepted writes.

Times are seconds on one clock that every process of the run shares (the host's
CLOCK_REALTIME: the nodes run on one machine, and a node whose clock the test steps
records its events in host time all the same). A message is named by a string that is
unique in the run (its body carries it); `target` is the queue's or stream's name.

A history is kept as JSON lines, one event per line with its kind under "event", so that
a soak's history can be written as it goes and checked again later.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

Outcome = Literal["confirmed", "refused", "unknown"]
Kind = Literal["queue", "stream"]


@dataclass(frozen=True, slots=True)
class Publish:
    """A publish and what came of it: `confirmed` (basic.ack or the stream's confirm),
    `refused` (basic.nack, a publish error), or `unknown` (the connection or the node
    went away before an answer). `sequence` orders a publisher's publishes; `node` is the
    node the publisher was connected to, the one that confirmed if any."""

    target: str
    message: str
    publisher: str
    sequence: int
    node: str
    sent: float
    outcome: Outcome
    answered: float | None = None


@dataclass(frozen=True, slots=True)
class Delivery:
    """A message handed to a consumer: `redelivered` as the delivery said (AMQP's flag);
    `offset` the stream offset it was read at (None for a queue); `session` which of the
    consumer's connections it came on (1 for its first; None in histories from before
    it was recorded)."""

    target: str
    message: str
    consumer: str
    node: str
    at: float
    redelivered: bool = False
    offset: int | None = None
    session: int | None = None


@dataclass(frozen=True, slots=True)
class Ack:
    """A consumer's ack of a delivered message (the broker may then forget it)."""

    target: str
    message: str
    consumer: str
    at: float


@dataclass(frozen=True, slots=True)
class Remaining:
    """What `target` held when the run ended, read after every fault was healed: for a
    queue the messages a final drain got, for a stream every record from its first
    offset with its offset (`offsets`, in the order read)."""

    target: str
    kind: Kind
    messages: tuple[str, ...]
    offsets: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Tenure:
    """An interval in which `node` held the leader's lease (`role` "lease", as etcd
    granted it) or accepted writes (`role` "writes", as the node itself logged it);
    `end` None: it still did at the end of the run."""

    node: str
    role: Literal["lease", "writes"]
    start: float
    end: float | None = None


Event = Publish | Delivery | Ack | Remaining | Tenure
KINDS: Final[dict[str, type[Event]]] = {
    "publish": Publish,
    "delivery": Delivery,
    "ack": Ack,
    "remaining": Remaining,
    "tenure": Tenure,
}
NAMES: Final[dict[type[Event], str]] = {kind: name for name, kind in KINDS.items()}


def to_line(event: Event) -> str:
    """`event` as one JSON line (without the newline)."""
    fields = dataclasses.asdict(event)
    return json.dumps({"event": NAMES[type(event)], **fields}, separators=(",", ":"))


def from_line(line: str) -> Event:
    """The event a line of `to_line` spells; ValueError for anything else."""
    try:
        fields = json.loads(line)
        kind = KINDS[fields.pop("event")]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a history line: {line[:200]!r}") from exc
    for name in ("messages", "offsets"):
        if isinstance(fields.get(name), list):
            fields[name] = tuple(fields[name])
    try:
        return kind(**fields)
    except TypeError as exc:
        raise ValueError(f"not a {NAMES[kind]} event: {line[:200]!r}") from exc


def write_history(path: Path, events: Iterable[Event]) -> None:
    """Writes `events` to `path` as JSON lines (no fsync: a record of a test run)."""
    with path.open("w", encoding="utf-8") as out:
        for event in events:
            out.write(to_line(event) + "\n")


def read_history(path: Path) -> Iterator[Event]:
    """The events of a file `write_history` wrote, in order."""
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                yield from_line(line)
