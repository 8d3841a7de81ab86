"""A channel error on a confirm channel: the publishes the channel stored before the
error are confirmed before its channel.close, never after it and never lost (a client
republishes what it never saw confirmed). RabbitMQ 3.10 loses those confirms; this is a
deliberate difference (docs/compatibility.md). Raw frames, so that the publishes and the
failing one arrive in one read, which is when the confirm used to race the close."""

from __future__ import annotations

from amqp_gateway.codec import methods as m
from tests.differential.wire import WireClient
from tests.integration.conftest import RunningBroker

ROUNDS = 20


def test_stored_publishes_are_confirmed_before_the_channel_closes(
    broker: RunningBroker,
) -> None:
    client = WireClient("127.0.0.1", broker.amqp_port)
    client.handshake()
    client.send(1, m.ChannelOpen())
    assert client.read()[2] == "channel.open-ok"
    client.send(1, m.QueueDeclare(queue="stored"))
    assert client.read()[2] == "queue.declare-ok"
    for _ in range(ROUNDS):
        client.send(1, m.ConfirmSelect())
        assert client.read()[2] == "confirm.select-ok"
        client.send_content(1, m.BasicPublish(exchange="", routing_key="stored"), b"one")
        client.send_content(1, m.BasicPublish(exchange="", routing_key="stored"), b"two")
        client.send_content(1, m.BasicPublish(exchange="missing", routing_key="k"), b"three")
        acked: list[int] = []
        while (read := client.read())[2] == "basic.ack":
            assert read[3]["multiple"] is True
            acked.append(read[3]["delivery_tag"])
        assert read[2] == "channel.close" and read[3]["reply_code"] == 404
        # One ack for both, or one each when the first publish was read (and synced)
        # on its own: either way tag 2 is confirmed before the close.
        assert acked in ([2], [1, 2])
        client.send(1, m.ChannelOpen())
        assert client.read()[2] == "channel.open-ok"
    client.send(1, m.QueueDeclare(queue="stored", passive=True))
    declared = client.read()
    assert declared[3]["message_count"] == 2 * ROUNDS
    client.close()
