"""What the client's announced capabilities change: a broker-side basic.cancel reaches
only clients that announce consumer_cancel_notify (rabbit_channel checks it)."""

from __future__ import annotations

from amqp_gateway.codec import methods as m
from tests.differential.harness import Session, scenario

NO_CAPABILITIES: dict[str, object] = {"product": "streamq-differential", "capabilities": {}}


@scenario("capabilities: no basic.cancel to a client that did not ask for it")
def _no_cancel_notify(s: Session) -> None:
    consumer = s.connect(client_properties=NO_CAPABILITIES)
    consumer.open(1)
    consumer.call(1, m.QueueDeclare(queue=s.name()))
    consumer.call(1, m.BasicConsume(queue=s.name(), consumer_tag="ctag"))
    deleter = s.channel(1, s.connect())
    deleter.call(1, m.QueueDelete(queue=s.name()))
    consumer.quiet()
    # The consumer is gone with its queue: a queue of the same name is not consumed.
    consumer.call(1, m.QueueDeclare(queue=s.name()))
    consumer.publish(1, "", s.name(), b"after")
    consumer.sync(1)
    consumer.call(1, m.BasicGet(queue=s.name(), no_ack=True))


@scenario("capabilities: basic.cancel to a client that asked for it")
def _cancel_notify(s: Session) -> None:
    consumer = s.channel()
    consumer.call(1, m.QueueDeclare(queue=s.name()))
    consumer.call(1, m.BasicConsume(queue=s.name(), consumer_tag="ctag"))
    deleter = s.channel(1, s.connect())
    deleter.call(1, m.QueueDelete(queue=s.name()))
    consumer.expect(1, "basic.cancel")
