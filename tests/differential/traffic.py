"""Delivery traffic against one broker, step by step, observed so that two brokers that
behave alike leave equal logs (the random differential test and scenarios/deliveries.py).

A run declares the world of `traffic_ops.py`, takes its steps, then drains: consumers
are cancelled, connections closed (what they held unacked goes back), and every queue
is read to its end with `basic.get`, so the final contents, their order and their
redelivered flags are compared too.

What makes the log deterministic although deliveries to consumers are asynchronous:

- Each step ends at a sync point. The acting channel's own round trip comes first (the
  method's reply, or a fence after an asynchronous one); then a passive declare of each
  queue, sources before their dead-letter target, on a control connection of its own
  (RabbitMQ's queue process has handled everything sent to it before, and sent the
  deliveries that caused to the consumers' channels, before it answers; its counts are
  logged); then a fence on every channel with consumers, which comes back after the
  deliveries sent to that channel.
- The deliveries a step caused are moved to the end of its part of the log, grouped by
  connection and channel, in the order each channel received them. A channel consumes
  from one queue only (`traffic_ops.consume`), and a queue hands its messages to a
  channel in order, so that order is RabbitMQ's to keep; across channels it is not.
- Settlements name deliveries by their place among the channel's unacked ones, which
  is the same message on both brokers when the logs agreed so far.

`Stats` counts what a run exercised (messages got, delivered, redelivered,
dead-lettered; real tags settled each way; closes and recovers with unacked messages):
the random test asserts that its runs really deliver.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial

from amqp_gateway.codec import methods as m
from tests.differential.harness import Conn, Session
from tests.differential.traffic_ops import (
    CHANNEL_SLOTS,
    CHANNELS_PER_CONNECTION,
    CONNECTION_SLOTS,
    PICK_SETTLED,
    PICK_ZERO,
    QUEUES,
    Op,
    World,
)
from tests.differential.wire import Observation

DRAIN_GETS_MAX = 200  # a queue holds at most what a run published; a bound all the same
CONTROL = 1  # the control connection's channel

Stats = Counter  # what a run exercised, by name (see the module docstring)


@dataclass
class ChannelState:
    """What the client knows of one channel slot: its unacked deliveries (tag to body),
    its consumers and their queue, and the tags it handed out and settled."""

    unacked: dict[int, bytes] = field(default_factory=dict)
    consumers: list[str] = field(default_factory=list)
    queue: str | None = None
    last_tag: int = 0
    settled_last: int | None = None


class Traffic:
    """One run of delivery traffic in session `s`; counts go to `stats`."""

    def __init__(self, s: Session, world: World, stats: Counter[str] | None = None) -> None:
        self.s = s
        self.world = world
        self.stats: Counter[str] = Counter() if stats is None else stats
        self.control: Conn | None = None
        self.conns: list[Conn] = []
        self.channels = [ChannelState() for _ in range(CHANNEL_SLOTS)]
        self.no_ack: dict[str, bool] = {}  # consumer tag to its no_ack, for the whole run
        self.published = 0
        self.consumers = 0
        self.seen = 0  # how much of the log `_account` has read

    def run(self, ops: Iterable[Op]) -> None:
        self.setup()
        for op in ops:
            self.step(op)
        self.drain()

    # The world.
    def setup(self) -> None:
        c = self.control = self.s.connect()
        c.open(CONTROL)
        name = self.s.name
        for exchange in ("dlx", "x0"):
            c.call(CONTROL, m.ExchangeDeclare(exchange=name(exchange), type="fanout"))
        q1: dict[str, object] = {"x-dead-letter-exchange": name("dlx")}
        if self.world.q1_max_length is not None:
            q1["x-max-length"] = self.world.q1_max_length
        for queue, arguments in (("q0", {}), ("q1", q1), ("dead", {})):
            c.call(CONTROL, m.QueueDeclare(queue=name(queue), arguments=arguments))  # type: ignore[arg-type]
        for queue, exchange in (("dead", "dlx"), ("q0", "x0"), ("q1", "x0")):
            c.call(CONTROL, m.QueueBind(queue=name(queue), exchange=name(exchange)))
        if self.world.preload:
            self._publish("both", self.world.preload)
        self.conns = [self._connect() for _ in range(CONNECTION_SLOTS)]
        self.seen = len(self.s.log)

    def _connect(self) -> Conn:
        conn = self.s.connect()
        for number in range(1, CHANNELS_PER_CONNECTION + 1):
            conn.open(number)
        return conn

    def _holding(self, slot: int) -> int:
        """`slot`, or the next slot after it that holds unacked deliveries if it holds
        none (a settle, recover or close names a channel that way: the same one on both
        brokers, and one that has something to give back more often than not)."""
        for step in range(CHANNEL_SLOTS):
            candidate = (slot + step) % CHANNEL_SLOTS
            if self.channels[candidate].unacked:
                return candidate
        return slot

    def _channel(self, slot: int) -> tuple[Conn, int, ChannelState]:
        conn = self.conns[slot // CHANNELS_PER_CONNECTION]
        return conn, slot % CHANNELS_PER_CONNECTION + 1, self.channels[slot]

    def _ctl(self) -> Conn:
        assert self.control is not None, "setup first"
        return self.control

    # A step.
    def step(self, op: Op) -> None:
        start = len(self.s.log)
        self.s.record("op", op.kind, op.args)
        self.seen = len(self.s.log)
        handler: Callable[..., None] = getattr(self, f"_{op.kind}")
        handler(*op.args)
        self._account()
        self._settle()
        self._account()
        self._group_deliveries(start)

    def _settle(self) -> None:
        """The sync point of the module docstring. The passive declares go round twice
        and only the second round is logged: RabbitMQ's queue process answers them
        before the casts still in its mailbox (gen_server2 priorities: `stat` is 7, a
        publish or a reject 0), so under load a first answer can predate the step; by
        the second, the queue process has run since, and taken those casts first."""
        start = len(self.s.log)
        for queue in QUEUES:
            self._ctl().call(CONTROL, m.QueueDeclare(queue=self.s.name(queue), passive=True))
        del self.s.log[start:]  # only declare-oks: the control connection has no consumer
        self.seen = min(self.seen, start)
        for queue in QUEUES:
            self._ctl().call(CONTROL, m.QueueDeclare(queue=self.s.name(queue), passive=True))
        for slot in range(CHANNEL_SLOTS):
            conn, number, state = self._channel(slot)
            if state.consumers and not conn.closed:
                conn.sync(number)

    def _group_deliveries(self, start: int) -> None:
        part = self.s.log[start:]
        deliveries = [o for o in part if _is_delivery(o)]
        rest = [o for o in part if not _is_delivery(o)]
        self.s.log[start:] = rest + sorted(deliveries, key=lambda o: (o[0], o[2]))

    def _account(self) -> None:
        """Reads what the brokers sent since the last call: deliveries join their
        channel's unacked ones; a closed channel or connection forgets its own and is
        opened again."""
        while self.seen < len(self.s.log):
            o = self.s.log[self.seen]
            self.seen += 1
            slot = self._connection_slot(o[0])
            if slot is None:
                continue
            if o[1] in ("closed", "socket closed") or o[3:4] == ("connection.close",):
                self._reconnect(slot)
            elif o[1] == "content" and o[3] == "basic.deliver":
                self._delivered(slot * CHANNELS_PER_CONNECTION + o[2] - 1, o)
            elif o[1] == "method" and o[3] == "channel.close":
                self.stats["channel closed by the broker"] += 1
                self._forget(slot * CHANNELS_PER_CONNECTION + o[2] - 1)
                self.conns[slot].open(o[2])

    def _connection_slot(self, tag: object) -> int | None:
        for slot, conn in enumerate(self.conns):
            if tag == f"c{conn.number}":
                return slot
        return None

    def _reconnect(self, slot: int) -> None:
        for number in range(CHANNELS_PER_CONNECTION):
            self._forget(slot * CHANNELS_PER_CONNECTION + number)
        self.conns[slot] = self._connect()

    def _forget(self, slot: int) -> None:
        if self.channels[slot].unacked:
            self.stats["closed with unacked messages"] += 1
        self.channels[slot] = ChannelState()

    def _delivered(self, slot: int, o: Observation) -> None:
        state, fields = self.channels[slot], o[4]
        tag = fields["delivery_tag"]
        state.last_tag = max(state.last_tag, tag)
        self._count_message("delivered", fields, o[5])
        if not self.no_ack.get(fields["consumer_tag"], False):
            state.unacked[tag] = o[6]

    def _count_message(self, how: str, fields: dict[str, object], properties: object) -> None:
        self.stats[how] += 1
        if fields.get("redelivered"):
            self.stats["redelivered"] += 1
        headers = properties.get("headers") if isinstance(properties, dict) else None
        if isinstance(headers, dict) and "x-death" in headers:
            self.stats["dead-lettered"] += 1

    # The operations (traffic_ops.py says what each means).
    def _publish(self, target: str, count: int) -> None:
        c = self._ctl()
        exchange, key = ("", self.s.name(target)) if target != "both" else (self.s.name("x0"), "")
        for _ in range(count):
            c.publish(CONTROL, exchange, key, f"m{self.published}".encode())
            self.published += 1
        c.sync(CONTROL)

    def _get(self, slot: int, queue: str, no_ack: bool) -> None:
        conn, number, state = self._channel(slot)
        reply = conn.call(number, m.BasicGet(queue=self.s.name(queue), no_ack=no_ack))
        self.stats["get"] += 1
        if reply[2] == "basic.get-ok":
            tag = reply[3]["delivery_tag"]
            state.last_tag = max(state.last_tag, tag)
            self._count_message("got", reply[3], reply[4])
            if not no_ack:
                state.unacked[tag] = reply[5]

    def _consume(self, slot: int, queue: str, no_ack: bool) -> None:
        conn, number, state = self._channel(slot)
        queue = state.queue or queue
        tag = f"c{self.consumers}"
        self.consumers += 1
        self.no_ack[tag] = no_ack
        method = m.BasicConsume(queue=self.s.name(queue), consumer_tag=tag, no_ack=no_ack)
        if conn.call(number, method)[2] == "basic.consume-ok":
            state.consumers.append(tag)
            state.queue = queue

    def _cancel(self, slot: int, pick: int) -> None:
        conn, number, state = self._channel(slot)
        tag = sorted(state.consumers)[pick % len(state.consumers)] if state.consumers else "none"
        if conn.call(number, m.BasicCancel(consumer_tag=tag))[2] == "basic.cancel-ok":
            if tag in state.consumers:
                state.consumers.remove(tag)
            if not state.consumers:
                state.queue = None

    def _qos(self, slot: int, prefetch: int, global_: bool) -> None:
        conn, number, _ = self._channel(slot)
        conn.call(number, m.BasicQos(prefetch_count=prefetch, global_=global_))

    def _ack(self, slot: int, pick: int, multiple: bool) -> None:
        self._settle_one(slot, pick, multiple, "ack", partial(m.BasicAck, multiple=multiple))

    def _nack(self, slot: int, pick: int, multiple: bool, requeue: bool) -> None:
        how = "nack requeue" if requeue else "nack"
        nack = partial(m.BasicNack, multiple=multiple, requeue=requeue)
        self._settle_one(slot, pick, multiple, how, nack)

    def _reject(self, slot: int, pick: int, requeue: bool) -> None:
        how = "reject requeue" if requeue else "reject"
        self._settle_one(slot, pick, False, how, partial(m.BasicReject, requeue=requeue))

    def _settle_one(
        self, slot: int, pick: int, multiple: bool, how: str, method: Callable[..., m.Method]
    ) -> None:
        """Settle the delivery `pick` names (traffic_ops.py); nothing when it names an
        unacked delivery and the channel has none."""
        conn, number, state = self._channel(self._holding(slot))
        tags = sorted(state.unacked)
        if pick >= 0 and not tags:
            self.s.record("nothing to settle")
            return
        tag = _picked(state, tags, pick)
        conn.send(number, method(delivery_tag=tag))
        conn.sync(number)
        settled = [t for t in tags if t == tag or (multiple and (tag == 0 or t < tag))]
        if settled:
            self.stats[f"{how} of real tags"] += 1
            if multiple:
                self.stats[f"{how} multiple of real tags"] += 1
        for t in settled:
            del state.unacked[t]
        state.settled_last = tag if tag in tags else state.settled_last

    def _recover(self, slot: int) -> None:
        conn, number, state = self._channel(self._holding(slot))
        if state.unacked:
            self.stats["recover with unacked messages"] += 1
        state.unacked.clear()  # back in their queues; what comes again comes with new tags
        conn.call(number, m.BasicRecover(requeue=True))

    def _purge(self, queue: str) -> None:
        self._ctl().call(CONTROL, m.QueuePurge(queue=self.s.name(queue)))

    def _close_channel(self, slot: int) -> None:
        slot = self._holding(slot)
        conn, number, _ = self._channel(slot)
        conn.call(number, m.ChannelClose(reply_code=200, reply_text="bye"))
        self._forget(slot)
        conn.open(number)

    def _close_connection(self, slot: int) -> None:
        self.conns[slot].close()
        self._reconnect(slot)

    # The end of a run.
    def drain(self) -> None:
        """Cancel every consumer, close the channels and connections, and read every
        queue to its end; then delete what the run declared."""
        self.s.record("drain")
        for slot in range(CHANNEL_SLOTS):
            conn, number, state = self._channel(slot)
            for tag in sorted(state.consumers):
                conn.call(number, m.BasicCancel(consumer_tag=tag))
        # Channel by channel: a connection.close ends its channels at once, and RabbitMQ
        # gives back what each held in the order they happen to end (which shows in the
        # order a full queue dead-letters them).
        for slot in range(CHANNEL_SLOTS):
            conn, number, _ = self._channel(slot)
            conn.call(number, m.ChannelClose(reply_code=200, reply_text="bye"))
        for conn in self.conns:
            conn.close()
        self.seen = len(self.s.log)
        c, name = self._ctl(), self.s.name
        for queue in QUEUES:
            for _ in range(DRAIN_GETS_MAX):
                reply = c.call(CONTROL, m.BasicGet(queue=name(queue), no_ack=True))
                if reply[2] != "basic.get-ok":
                    break
        for queue in QUEUES:
            c.call(CONTROL, m.QueueDelete(queue=name(queue)))
        for exchange in ("dlx", "x0"):
            c.call(CONTROL, m.ExchangeDelete(exchange=name(exchange)))


def _is_delivery(o: Observation) -> bool:
    return len(o) > 3 and o[1] == "content" and o[3] == "basic.deliver"


def _picked(state: ChannelState, tags: list[int], pick: int) -> int:
    if pick >= 0:
        return tags[pick % len(tags)]
    if pick == PICK_ZERO:
        return 0
    if pick == PICK_SETTLED and state.settled_last is not None:
        return state.settled_last
    return state.last_tag + 1
