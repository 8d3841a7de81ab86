"""A bug in a method handler closes that connection with 541 INTERNAL_ERROR; the broker
and its other connections go on."""

from __future__ import annotations

import threading

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


def test_output_for_a_connection_already_lost_is_dropped(
    broker: RunningBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A confirm round that ends after its client went away (`connection_lost` ran
    while it waited for the disk) still flushes: uvloop's `write` on the closed
    transport raises. The bytes have nowhere to go and are dropped; the flush does not
    raise (it did, and the confirm task died with 'Task exception was never
    retrieved')."""
    made: list[session.AmqpSession] = []
    connection_made = session.AmqpSession.connection_made
    connection_lost = session.AmqpSession.connection_lost
    lost = threading.Event()

    def record(self: session.AmqpSession, transport: object) -> None:
        made.append(self)
        connection_made(self, transport)  # type: ignore[arg-type]

    def note_lost(self: session.AmqpSession, exc: Exception | None) -> None:
        connection_lost(self, exc)
        lost.set()

    monkeypatch.setattr(session.AmqpSession, "connection_made", record)
    monkeypatch.setattr(session.AmqpSession, "connection_lost", note_lost)
    client = connect(broker)
    (victim,) = made
    client._impl._transport._sock.close()  # type: ignore[union-attr]  # gone, no close
    assert lost.wait(10), "the broker never saw the socket close"

    def flush_late() -> str | None:
        victim.conn.send_method(0, m.ConnectionBlocked(reason="late"))
        try:
            victim.flush()
        except Exception as exc:  # what the test is about
            return repr(exc)
        return None

    assert broker.ask(flush_late) is None
    other = connect(broker)  # the broker goes on
    other.channel().queue_declare("after")
    other.close()
