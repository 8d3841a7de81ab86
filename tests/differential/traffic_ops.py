"""The operations of delivery traffic (`traffic.py`): what a step does, written once for
Hypothesis's strategies (the random test) and for the explicit scenarios
(scenarios/deliveries.py), plus the world they run in.

The world is small on purpose, so that steps meet: two work queues, `q0` and `q1`, a
fanout exchange `x0` bound to both, and `q1` dead-letters (through the fanout `dlx`) to
`dead`. Two connections of two channels each act (channel slots 0-3: connection slot 0
has slots 0 and 1, connection slot 1 has slots 2 and 3). An operation names a delivery
it settles by its place among the channel's unacked deliveries (`pick`), never by a
delivery tag, so it means the same message on both brokers; a negative pick names a
tag that is wrong on purpose (`PICK_*`). A settle, recover or channel close that names
a channel slot without unacked deliveries acts on the next slot that has some.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

QUEUES = ("q0", "q1", "dead")  # sources before their dead-letter target
TARGETS = ("q0", "q1", "both")  # where a publish goes: a queue, or x0 to both
CHANNEL_SLOTS = 4
CONNECTION_SLOTS = 2
CHANNELS_PER_CONNECTION = 2
PUBLISH_COUNT_MAX = 4
PREFETCH_MAX = 3
PICK_MAX = 7
PICK_ZERO = -1  # delivery tag 0 ("everything" with multiple)
PICK_UNKNOWN = -2  # a tag never handed out on the channel
PICK_SETTLED = -3  # the tag settled last on the channel (or an unknown one)


@dataclass(frozen=True)
class World:
    """What a run sets up before its first step: `q1`'s length limit (drop-head, so
    overflow dead-letters to `dead`) or none, and how many messages x0 carries to both
    queues first (so that the first gets and consumers find some)."""

    q1_max_length: int | None = None
    preload: int = 0


@dataclass(frozen=True)
class Op:
    """One step: a kind and its arguments (see the constructors below)."""

    kind: str
    args: tuple[object, ...] = ()


def publish(target: str, count: int = 1) -> Op:
    """`count` messages with bodies new to the run, to a queue or to x0 (`both`)."""
    return Op("publish", (target, count))


def get(channel: int, queue: str, no_ack: bool = False) -> Op:
    return Op("get", (channel, queue, no_ack))


def consume(channel: int, queue: str, no_ack: bool = False) -> Op:
    """A consumer with a tag new to the run; on a channel that consumes from another
    queue already, from that one (so a channel's deliveries have one order)."""
    return Op("consume", (channel, queue, no_ack))


def cancel(channel: int, pick: int = 0) -> Op:
    """Cancel the channel's `pick`th consumer (by tag), or an unknown tag if none."""
    return Op("cancel", (channel, pick))


def qos(channel: int, prefetch: int, global_: bool = False) -> Op:
    return Op("qos", (channel, prefetch, global_))


def ack(channel: int, pick: int, multiple: bool = False) -> Op:
    return Op("ack", (channel, pick, multiple))


def nack(channel: int, pick: int, multiple: bool = False, requeue: bool = True) -> Op:
    return Op("nack", (channel, pick, multiple, requeue))


def reject(channel: int, pick: int, requeue: bool = True) -> Op:
    return Op("reject", (channel, pick, requeue))


def recover(channel: int) -> Op:
    """basic.recover requeue=True."""
    return Op("recover", (channel,))


def purge(queue: str) -> Op:
    return Op("purge", (queue,))


def close_channel(channel: int) -> Op:
    """channel.close (its unacked messages go back), then the channel is opened again."""
    return Op("close_channel", (channel,))


def close_connection(connection: int) -> Op:
    """connection.close of a connection slot, then a new connection with its channels."""
    return Op("close_connection", (connection,))


# Hypothesis's strategies. Kinds are drawn with weights, so that most runs publish, take
# and settle, and closes stay rare enough to let unacked messages pile up first.
_WEIGHTS = {
    "publish": 6,
    "get": 4,
    "consume": 2,
    "cancel": 1,
    "qos": 2,
    "ack": 3,
    "nack": 2,
    "reject": 2,
    "recover": 1,
    "purge": 1,
    "close_channel": 1,
    "close_connection": 1,
}


def _picks() -> st.SearchStrategy[int]:
    """Mostly an unacked delivery; one time in nine a wrong tag on purpose."""
    right = tuple(range(PICK_MAX + 1)) * 3
    return st.sampled_from((*right, PICK_ZERO, PICK_UNKNOWN, PICK_SETTLED))


def _arguments() -> dict[str, st.SearchStrategy[tuple[object, ...]]]:
    channel = st.integers(min_value=0, max_value=CHANNEL_SLOTS - 1)
    queue, flag, pick = st.sampled_from(QUEUES), st.booleans(), _picks()
    source = st.sampled_from(("q0", "q1", "q0", "q1", "dead"))  # where gets look
    mostly_not = st.sampled_from((False, False, True))  # no_ack: most deliveries need acks
    return {
        "publish": st.tuples(
            st.sampled_from(TARGETS), st.integers(min_value=1, max_value=PUBLISH_COUNT_MAX)
        ),
        "get": st.tuples(channel, source, mostly_not),
        "consume": st.tuples(channel, queue, mostly_not),
        "cancel": st.tuples(channel, st.integers(min_value=0, max_value=2)),
        "qos": st.tuples(channel, st.integers(min_value=0, max_value=PREFETCH_MAX), flag),
        "ack": st.tuples(channel, pick, flag),
        "nack": st.tuples(channel, pick, flag, flag),
        "reject": st.tuples(channel, pick, flag),
        "recover": st.tuples(channel),
        "purge": st.tuples(queue),
        "close_channel": st.tuples(channel),
        "close_connection": st.tuples(st.integers(min_value=0, max_value=CONNECTION_SLOTS - 1)),
    }


def operations() -> st.SearchStrategy[Op]:
    arguments = _arguments()
    kinds = [kind for kind, weight in _WEIGHTS.items() for _ in range(weight)]
    return st.sampled_from(kinds).flatmap(lambda kind: arguments[kind].map(lambda a: Op(kind, a)))


def worlds() -> st.SearchStrategy[World]:
    return st.builds(World, st.sampled_from((None, None, 2, 3)), st.sampled_from((3, 0, 6)))
