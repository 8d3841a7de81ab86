"""A bug in a method handler closes that connection with 541 INTERNAL_ERROR; the broker
and its other connections go on."""

from __future__ import annotations

import pika
import pika.exceptions
import pytest

from amqp_gateway import channel_methods, session
from amqp_gateway.channels import ChannelSession
from amqp_gateway.codec import methods as m
from tests.integration.conftest import RunningBroker


def broken_handler(handler: session.AmqpSession, channel: ChannelSession, method: m.Method) -> None:
    raise RuntimeError("a bug")


def connect(broker: RunningBroker) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", broker.amqp_port, blocked_connection_timeout=10)
    )


def test_a_handler_bug_is_541_for_its_connection_only(
    broker: RunningBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    bystander = connect(broker)
    bystander_channel = bystander.channel()
    bystander_channel.queue_declare("still-here")
    monkeypatch.setitem(channel_methods.METHOD_HANDLERS, m.BasicRecover, broken_handler)
    victim = connect(broker)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        victim.channel().basic_recover(requeue=True)
    assert closed.value.reply_code == 541
    assert closed.value.reply_text.startswith("INTERNAL_ERROR")
    bystander_channel.basic_publish("", "still-here", b"ok")
    method, _, body = bystander_channel.basic_get("still-here", auto_ack=True)
    assert method is not None and body == b"ok"
    bystander.close()
