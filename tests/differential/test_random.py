"""Random sequences of operations, run against RabbitMQ and streamq: what a client
observes must be equal.

Hypothesis draws a list of operations over a small world (three queues, one exchange
of our own and the built-in ones, a few routing and binding keys), so that sequences
often meet: a publish finds a binding made two steps before, a delete finds a queue in
use, an ack names a tag that a get handed out or one it did not. Each operation is a
round trip on channel 1 of one raw connection; a channel the broker closed is opened
again by the next operation, a closed connection ends the run. The names of each example
are its own, so no example sees another's queues.

Every example starts from the same world (`_setup`), so that gets find messages and
settles name real tags; deliveries to consumers, with every way of settling them, are
test_random_deliveries.py's.

In CI the examples are derandomized (the same every run, so a red build is a real
difference, reproducible); `STREAMQ_DIFFERENTIAL_EXPLORE=1` draws new ones, and
`STREAMQ_DIFFERENTIAL_EXAMPLES=N` sets how many.
"""

from __future__ import annotations

import itertools
import os
from collections import Counter
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amqp_gateway.codec import methods as m
from tests.differential.allowlist import RANDOM_MASK
from tests.differential.harness import (
    Scenario,
    ScenarioAbort,
    Session,
    explain,
    run_scenario,
)
from tests.differential.peers import Endpoint
from tests.differential.wire import Observation

QUEUES = ("q0", "q1", "q2")
EXCHANGE_TYPES = ("direct", "fanout", "topic")
ROUTING_KEYS = ("", "a", "b", "a.b", "b.a.c")
BINDING_KEYS = ("", "a", "b", "#", "*", "a.#", "*.a", "#.c", "a.b")
EXAMPLES = int(os.environ.get("STREAMQ_DIFFERENTIAL_EXAMPLES", "40"))
EXPLORE = os.environ.get("STREAMQ_DIFFERENTIAL_EXPLORE") == "1"
SETUP_MESSAGES = 2  # in each queue before the first operation
GOT_PER_GET_MIN = 0.2  # of the gets, those that must find a message (test_random_deliveries)


@dataclass(frozen=True)
class Op:
    """One operation: a method name and its arguments, drawn by `operations`."""

    kind: str
    args: tuple[object, ...]


def _exchanges() -> st.SearchStrategy[str]:
    return st.sampled_from(("x0", "amq.direct", "amq.fanout", "amq.topic", ""))


def operations() -> st.SearchStrategy[Op]:
    queue, key = st.sampled_from(QUEUES), st.sampled_from(ROUTING_KEYS)
    flag, binding = st.booleans(), st.sampled_from(BINDING_KEYS)
    small = st.integers(min_value=0, max_value=4)
    ops = {
        "declare_queue": st.tuples(queue, flag, flag, st.sampled_from((None, 1, 2))),
        "passive_queue": st.tuples(queue),
        "declare_exchange": st.tuples(st.sampled_from(EXCHANGE_TYPES), flag),
        "delete_exchange": st.tuples(flag),
        "delete_queue": st.tuples(queue, flag, flag),
        "bind": st.tuples(queue, _exchanges(), binding),
        "unbind": st.tuples(queue, _exchanges(), binding),
        "purge": st.tuples(queue),
        "publish": st.tuples(_exchanges(), key, small, flag),
        "publish_to_queue": st.tuples(queue, small),
        "get": st.tuples(queue, flag),
        "ack": st.tuples(small, flag),
        "nack": st.tuples(small, flag, flag),
        "reject": st.tuples(small, flag),
        "recover": st.tuples(),
    }
    return st.one_of(
        [args.map(lambda a, kind=kind: Op(kind, a)) for kind, args in ops.items()]  # type: ignore[misc]
    )


def _resolve(s: Session, exchange: str) -> str:
    return s.name(exchange) if exchange == "x0" else exchange


def apply(s: Session, conn_holder: list[object], op: Op) -> None:
    """Run `op` on channel 1 of the session's connection, reopening the channel first
    when the broker closed it."""
    c = s.conns[-1]
    if c.closed:
        raise ScenarioAbort("connection closed")
    if 1 in conn_holder:
        conn_holder.remove(1)
        c.open(1)
    before = len(s.log)
    a = op.args
    if op.kind == "declare_queue":
        arguments = {} if a[3] is None else {"x-max-length": a[3]}
        c.call(
            1,
            m.QueueDeclare(
                queue=s.name(str(a[0])),
                durable=bool(a[1]),
                auto_delete=bool(a[2]),
                arguments=arguments,
            ),
        )
    elif op.kind == "passive_queue":
        c.call(1, m.QueueDeclare(queue=s.name(str(a[0])), passive=True))
    elif op.kind == "declare_exchange":
        c.call(1, m.ExchangeDeclare(exchange=s.name("x0"), type=str(a[0]), durable=bool(a[1])))
    elif op.kind == "delete_exchange":
        c.call(1, m.ExchangeDelete(exchange=s.name("x0"), if_unused=bool(a[0])))
    elif op.kind == "delete_queue":
        c.call(1, m.QueueDelete(queue=s.name(str(a[0])), if_unused=bool(a[1]), if_empty=bool(a[2])))
    elif op.kind in ("bind", "unbind"):
        method = m.QueueBind if op.kind == "bind" else m.QueueUnbind
        c.call(
            1,
            method(queue=s.name(str(a[0])), exchange=_resolve(s, str(a[1])), routing_key=str(a[2])),
        )
    elif op.kind == "purge":
        c.call(1, m.QueuePurge(queue=s.name(str(a[0]))))
    elif op.kind == "publish":
        body = f"m{a[2]}".encode()
        c.publish(1, _resolve(s, str(a[0])), str(a[1]), body, mandatory=bool(a[3]))
        c.sync(1)
    elif op.kind == "publish_to_queue":
        c.publish(1, "", s.name(str(a[0])), f"m{a[1]}".encode())
        c.sync(1)
    elif op.kind == "get":
        c.call(1, m.BasicGet(queue=s.name(str(a[0])), no_ack=bool(a[1])))
    elif op.kind == "ack":
        c.send(1, m.BasicAck(delivery_tag=int(a[0]), multiple=bool(a[1])))
        c.sync(1)
    elif op.kind == "nack":
        c.send(1, m.BasicNack(delivery_tag=int(a[0]), multiple=bool(a[1]), requeue=bool(a[2])))
        c.sync(1)
    elif op.kind == "reject":
        c.send(1, m.BasicReject(delivery_tag=int(a[0]), requeue=bool(a[1])))
        c.sync(1)
    elif op.kind == "recover":
        c.call(1, m.BasicRecover(requeue=True))
    if any(o[3] == "channel.close" for o in s.log[before:] if len(o) > 3):
        conn_holder.append(1)  # reopen before the next operation


_examples = itertools.count()


def _setup(s: Session) -> None:
    """The world every example starts from: its queues declared, with a few messages
    each, and x0 (direct) with q0 bound by "a". Without it, most operations met no
    queue (a drawn sequence rarely declared one before using it), closed channel 1 with
    404, and not one get of the derandomized examples found a message."""
    c = s.conns[0]
    for queue in QUEUES:
        c.call(1, m.QueueDeclare(queue=s.name(queue)))
    c.call(1, m.ExchangeDeclare(exchange=s.name("x0"), type="direct"))
    c.call(1, m.QueueBind(queue=s.name("q0"), exchange=s.name("x0"), routing_key="a"))
    # The messages go on channel 2 in confirm mode, and are confirmed before the first
    # operation: RabbitMQ under load answered a passive declare on channel 1 before it had
    # enqueued them (message_count 0 where 2 were published, in a full run).
    c.open(2)
    c.call(2, m.ConfirmSelect())
    for queue in QUEUES:
        for number in range(SETUP_MESSAGES):
            c.publish(2, "", s.name(queue), f"s{number}".encode())
    c.confirms(2, len(QUEUES) * SETUP_MESSAGES)


def _run_ops(ops: list[Op]) -> Scenario:
    def run(s: Session) -> None:
        s.connect()
        s.conns[0].open(1)
        _setup(s)
        reopen: list[object] = []
        for op in ops:
            s.record("op", op.kind, op.args)
            apply(s, reopen, op)

    return Scenario("random", run)


def _count_gets(observations: list[Observation], stats: Counter[str]) -> None:
    for o in observations:
        if len(o) > 3 and o[3] in ("basic.get-ok", "basic.get-empty"):
            stats[o[3]] += 1


def test_random_sequences_match_rabbitmq(rabbitmq: Endpoint, streamq: Endpoint) -> None:
    stats: Counter[str] = Counter()

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=not EXPLORE,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(ops=st.lists(operations(), min_size=1, max_size=14))
    def compare(ops: list[Op]) -> None:
        prefix = f"r{next(_examples)}-"
        spec = _run_ops(ops)
        expected = RANDOM_MASK(run_scenario(spec, rabbitmq, prefix))
        observed = RANDOM_MASK(run_scenario(spec, streamq, prefix))
        _count_gets(expected, stats)
        assert observed == expected, explain(expected, observed)

    compare()
    gets = stats["basic.get-ok"] + stats["basic.get-empty"]
    assert stats["basic.get-ok"] >= GOT_PER_GET_MIN * gets, f"gets that found a message: {stats}"
