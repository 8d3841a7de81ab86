"""Delivery traffic: publishes, gets and consumers on several channels and connections,
settled every way (ack, nack, reject, recover, closes with unacked messages), with
prefetch, a length limit and dead-lettering. Each scenario is a world and a list of
steps that traffic.py runs with a sync point after each step (the random test's
machinery, test_random_deliveries.py), so consumers' asynchronous deliveries compare
deterministically; the final contents of every queue are read back and compared too.

Some are the baseline of each way a delivery ends; the rest are what explorations of
the random test found (a difference RabbitMQ had with streamq, now fixed, or a case
worth keeping), each shrunk by hand to the steps that show it.
"""

from __future__ import annotations

from tests.differential.harness import Session, scenario
from tests.differential.traffic import Traffic
from tests.differential.traffic_ops import (
    PICK_SETTLED,
    PICK_UNKNOWN,
    PICK_ZERO,
    Op,
    World,
    ack,
    cancel,
    close_channel,
    close_connection,
    consume,
    get,
    nack,
    publish,
    purge,
    qos,
    recover,
    reject,
)


def traffic(name: str, world: World, *ops: Op) -> None:
    """Register scenario `name`: `ops` run by traffic.py in `world`."""

    def run(s: Session) -> None:
        Traffic(s, world).run(ops)

    scenario(name, "deliveries")(run)


# Baselines: each way a delivery ends, with consumers on two connections.

traffic(
    "deliveries: acks single and multiple from gets and consumers",
    World(preload=4),
    get(0, "q0"),
    get(0, "q0"),
    consume(1, "q1"),
    ack(0, 1),
    ack(1, 2, multiple=True),
    ack(0, 0),
    ack(1, 0),
)
traffic(
    "deliveries: nack multiple with requeue goes to the other connection's consumer in order",
    World(preload=3),
    qos(2, 1),
    consume(2, "q0"),
    consume(0, "q0"),
    nack(0, 1, multiple=True),
    ack(2, 0),
    ack(2, 0),
)
traffic(
    "deliveries: nack and reject without requeue dead-letter to a consumer of dead",
    World(preload=3),
    consume(2, "dead"),
    get(0, "q1"),
    get(0, "q1"),
    reject(0, 0, requeue=False),
    nack(0, 0, requeue=False),
    get(1, "q0"),
    nack(1, 0, requeue=False),
    ack(2, 1, multiple=True),
)
traffic(
    "deliveries: recover requeues gets and consumer deliveries to consumers with prefetch",
    World(preload=3),
    get(0, "q0"),
    qos(0, 1),
    consume(0, "q0"),
    consume(3, "q0"),
    recover(0),
    recover(3),
    ack(0, 0),
)
traffic(
    "deliveries: a closed channel and a closed connection requeue what they held",
    World(preload=4),
    qos(1, 2),
    consume(1, "q1"),
    get(0, "q0", no_ack=False),
    get(2, "q0"),
    consume(3, "q0"),
    close_channel(1),
    close_connection(1),
    consume(2, "q1", no_ack=True),
)
traffic(
    "deliveries: a cancelled consumer's deliveries stay unacked until settled",
    World(preload=3),
    qos(0, 2),
    consume(0, "q0"),
    cancel(0),
    publish("q0", 2),
    reject(0, 1),
    nack(0, 0, multiple=True, requeue=False),
    get(1, "q0"),
)
traffic(
    "deliveries: wrong tags close the channel and requeue its deliveries",
    World(preload=3),
    get(0, "q0"),
    ack(0, PICK_UNKNOWN),
    get(0, "q0"),
    ack(0, 0),
    ack(0, PICK_SETTLED),
    get(1, "q1"),
    reject(1, PICK_ZERO),
    get(2, "q1"),
    nack(2, PICK_ZERO, multiple=True),
    purge("q1"),
)
traffic(
    "deliveries: global prefetch shared by two consumers of the channel",
    World(preload=3),
    qos(0, 2, global_=True),
    consume(0, "q0"),
    consume(0, "q0"),
    ack(0, 0),
    publish("both", 2),
    ack(0, 0, multiple=True),
)

# Found by explorations, and fixed.

traffic(
    "deliveries: a close requeues over a drop-head max-length, the head is dead-lettered",
    World(q1_max_length=2),
    publish("q1", 2),
    get(0, "q1"),
    get(0, "q1"),
    publish("q1", 2),
    close_channel(0),
)
traffic(
    "deliveries: a nack multiple requeues each get alone over a drop-head max-length",
    World(q1_max_length=2),
    publish("q1", 2),
    get(0, "q1"),
    get(0, "q1"),
    reject(0, 0),
    get(0, "q1"),  # m0 again, with a tag after m1's
    publish("q1", 2),
    nack(0, 1, multiple=True),  # a group per get, in tag order: m1 dropped, then m0
)
traffic(
    "deliveries: a reject with requeue over a drop-head max-length",
    World(q1_max_length=2, preload=2),
    get(0, "q1"),
    publish("q1", 1),
    reject(0, 0),
    consume(1, "dead"),
)
traffic(
    "deliveries: a global prefetch counts the gets unacked when it was set",
    World(preload=3),
    get(0, "q0"),
    qos(0, 1, global_=True),
    consume(0, "q1"),
    ack(0, 0),
    get(0, "q0"),
    qos(0, 2, global_=True),
    ack(0, 1),
    qos(0, 0, global_=True),
)
traffic(
    "deliveries: a global prefetch at its limit holds no_ack consumers too",
    World(preload=3),
    get(0, "q0"),
    qos(0, 1, global_=True),
    consume(0, "q1", no_ack=True),
    qos(0, 2, global_=True),
)
traffic(
    "deliveries: a recover requeues and delivers consumer by consumer",
    World(q1_max_length=2),
    consume(1, "q1"),
    consume(1, "q1"),
    publish("q1", 4),
    recover(1),
)
traffic(
    "deliveries: a burst of publishes to a limited queue goes to its consumer first",
    World(q1_max_length=2, preload=3),
    consume(1, "q1", no_ack=True),
    publish("q1", 4),
    qos(2, 1),
    consume(2, "q1"),
    publish("q1", 4),
)
traffic(
    "deliveries: a nack multiple without requeue dead-letters gets before consumers",
    World(preload=3),
    qos(0, 1),
    consume(0, "q1"),
    get(0, "q1"),
    nack(0, 1, multiple=True, requeue=False),
)
traffic(
    "deliveries: an ack multiple of a tag that is not unacked is a 406 that settles nothing",
    World(preload=3),
    get(0, "q0"),
    ack(0, PICK_UNKNOWN, multiple=True),  # the tag after the last one handed out
    get(1, "q0"),
    get(1, "q0"),
    get(1, "q0"),
    ack(1, 1),
    nack(1, PICK_SETTLED, multiple=True),  # the tag just acked, with one unacked before it
)
traffic(
    "deliveries: a consumer out of credit rejoins the round robin at its end",
    World(),
    qos(0, 1),
    consume(0, "q0"),
    consume(1, "q0", no_ack=True),
    consume(2, "q0", no_ack=True),
    publish("q0", 3),
    publish("q0", 3),  # c0 has no credit: it leaves the turns
    ack(0, 0),  # and comes back after c2 and c1, in the order RabbitMQ serves them
    publish("q0", 3),
)
traffic(
    "deliveries: basic.qos global=false lifts the channel's global prefetch",
    World(preload=6),
    qos(1, 2, global_=True),
    consume(1, "q1"),
    qos(1, 3),  # for consumers to come; c0 had no prefetch of its own: it takes the rest
    consume(1, "q1"),
)
traffic(
    "deliveries: a consumer is not passed over when there is nothing to deliver",
    World(q1_max_length=3),
    consume(3, "q0", no_ack=True),
    consume(2, "q0"),
    publish("q0", 3),
    consume(2, "q0"),
    qos(2, 1, global_=True),  # the channel of c1 and c2 is at its limit
    publish("q0", 1),  # to c0; c2 is next but not tried: the queue is empty
    nack(2, 0, requeue=False),  # c1 back at the end
    publish("both", 1),  # so c2 takes it
)
