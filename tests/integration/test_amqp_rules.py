"""RabbitMQ 3.x compatibility of the AMQP gateway's entity rules, driven by unmodified
pika clients: redeclare and delete rules with RabbitMQ's reply codes and texts, reserved
names, tx and confirm modes, server-named and auto-delete queues, bodies over a small
frame_max, routing by headers, topic and fanout, and several channels on one connection.

Every expected code and text here was checked against a RabbitMQ 3.10 server."""

from __future__ import annotations

from collections.abc import Callable

import pika
import pika.channel
import pika.exceptions
import pika.frame
import pika.spec
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.integration.amqp_compat_calls import (
    TIMEOUT_S,
    VHOST_TEXT,
    channel_error,
    connect,
    connection_error,
    message_count,
    wait_until,
)
from tests.integration.conftest import RunningBroker, drain_bodies

# -- redeclare and delete rules ------------------------------------------------------------


def inequivalent(field: str, kind: str, name: str, received: str, current: str) -> str:
    return (
        f"PRECONDITION_FAILED - inequivalent arg '{field}' for {kind} '{name}' {VHOST_TEXT}: "
        f"received {received} but current is {current}"
    )


@pytest.mark.parametrize(
    ("first", "second", "text"),
    [
        (
            {"durable": False},
            {"durable": True},
            inequivalent("durable", "queue", "rd", "'true'", "'false'"),
        ),
        (
            {},
            {"auto_delete": True},
            inequivalent("auto_delete", "queue", "rd", "'true'", "'false'"),
        ),
        pytest.param(
            {"arguments": {"x-message-ttl": 1000}},
            {"arguments": {"x-message-ttl": 2000}},
            inequivalent("x-message-ttl", "queue", "rd", "'2000'", "'1000'"),
        ),
        pytest.param(
            {"arguments": {"x-message-ttl": 1000}},
            {},
            inequivalent(
                "x-message-ttl", "queue", "rd", "none", "the value '1000' of type 'signedint'"
            ),
        ),
        pytest.param(
            {},
            {"arguments": {"x-max-length": 5}},
            inequivalent(
                "x-max-length", "queue", "rd", "the value '5' of type 'signedint'", "none"
            ),
        ),
    ],
)
def test_queue_redeclare_with_other_properties_is_406(
    connection: pika.BlockingConnection, first: dict, second: dict, text: str
) -> None:
    connection.channel().queue_declare("rd", **first)
    closed = channel_error(connection, lambda ch: ch.queue_declare("rd", **second))
    assert (closed.reply_code, closed.reply_text) == (406, text)


def test_queue_redeclare_as_exclusive_is_405(connection: pika.BlockingConnection) -> None:
    connection.channel().queue_declare("rx")
    closed = channel_error(connection, lambda ch: ch.queue_declare("rx", exclusive=True))
    assert closed.reply_code == 405
    assert closed.reply_text == (
        f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue 'rx' {VHOST_TEXT}. "
        "It could be originally declared on another connection or the exclusive property "
        "value does not match that of the original declaration."
    )


@pytest.mark.parametrize(
    ("second", "text"),
    [
        (
            {"exchange_type": "fanout"},
            inequivalent("type", "exchange", "rx", "'fanout'", "'direct'"),
        ),
        ({"durable": True}, inequivalent("durable", "exchange", "rx", "'true'", "'false'")),
        ({"auto_delete": True}, inequivalent("auto_delete", "exchange", "rx", "'true'", "'false'")),
        ({"internal": True}, inequivalent("internal", "exchange", "rx", "'true'", "'false'")),
        pytest.param(
            {"arguments": {"alternate-exchange": "b"}},
            inequivalent("alternate-exchange", "exchange", "rx", "'b'", "'a'"),
        ),
    ],
)
def test_exchange_redeclare_with_other_properties_is_406(
    connection: pika.BlockingConnection, second: dict, text: str
) -> None:
    connection.channel().exchange_declare("rx", "direct", arguments={"alternate-exchange": "a"})
    second = {"exchange_type": "direct", "arguments": {"alternate-exchange": "a"}, **second}
    closed = channel_error(connection, lambda ch: ch.exchange_declare("rx", **second))
    assert (closed.reply_code, closed.reply_text) == (406, text)


def test_redeclare_ignores_arguments_rabbitmq_does_not_check(channel: BlockingChannel) -> None:
    channel.queue_declare("uq", arguments={"x-foo": 1})
    channel.queue_declare("uq", arguments={"x-foo": 2})
    channel.exchange_declare("ux", "direct", arguments={"foo": 1})
    channel.exchange_declare("ux", "direct", arguments={"foo": 2})


def test_amq_prefixed_exchange_names_are_reserved(connection: pika.BlockingConnection) -> None:
    closed = channel_error(connection, lambda ch: ch.exchange_declare("amq.mine", "direct"))
    assert (closed.reply_code, closed.reply_text) == (
        403,
        "ACCESS_REFUSED - exchange name 'amq.mine' contains reserved prefix 'amq.*'",
    )
    # Redeclaring a predeclared exchange equivalently is fine, as is a passive declare.
    channel = connection.channel()
    channel.exchange_declare("amq.direct", "direct", durable=True)
    channel.exchange_declare("amq.topic", passive=True)


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("amq.direct", f"deletion of system exchange 'amq.direct' {VHOST_TEXT} not allowed"),
        ("", "operation not permitted on the default exchange"),
    ],
)
def test_predeclared_exchanges_cannot_be_deleted(
    connection: pika.BlockingConnection, name: str, text: str
) -> None:
    closed = channel_error(connection, lambda ch: ch.exchange_delete(name))
    assert (closed.reply_code, closed.reply_text) == (403, f"ACCESS_REFUSED - {text}")


def test_exchange_delete_if_unused_refuses_a_bound_exchange(
    connection: pika.BlockingConnection, channel: BlockingChannel
) -> None:
    channel.exchange_declare("bx", "direct")
    channel.queue_declare("bq")
    channel.queue_bind("bq", "bx", "k")
    closed = channel_error(connection, lambda ch: ch.exchange_delete("bx", if_unused=True))
    assert (closed.reply_code, closed.reply_text) == (
        406,
        f"PRECONDITION_FAILED - exchange 'bx' {VHOST_TEXT} in use",
    )
    channel.queue_unbind("bq", "bx", "k")
    channel.exchange_delete("bx", if_unused=True)
    closed = channel_error(connection, lambda ch: ch.exchange_declare("bx", passive=True))
    assert closed.reply_code == 404


@pytest.mark.parametrize(
    ("flag", "text"),
    [
        pytest.param(
            "if_empty",
            f"PRECONDITION_FAILED - queue 'dq' {VHOST_TEXT} not empty",
        ),
        ("if_unused", f"PRECONDITION_FAILED - queue 'dq' {VHOST_TEXT} in use"),
    ],
)
def test_queue_delete_conditions(connection: pika.BlockingConnection, flag: str, text: str) -> None:
    channel = connection.channel()
    channel.queue_declare("dq")
    if flag == "if_empty":
        channel.basic_publish("", "dq", b"m")
    else:
        channel.basic_consume("dq", lambda *args: None)
    closed = channel_error(connection, lambda ch: ch.queue_delete("dq", **{flag: True}))
    assert (closed.reply_code, closed.reply_text) == (406, text)
    channel.queue_declare("dq", passive=True)  # still there


def test_deleting_a_missing_queue_succeeds(channel: BlockingChannel) -> None:
    assert channel.queue_delete("never-declared").method.message_count == 0


def test_unbinding_what_does_not_exist_succeeds(channel: BlockingChannel) -> None:
    channel.queue_declare("ub")
    channel.queue_unbind("ub", "amq.direct", "never-bound")
    channel.queue_unbind("ub", "no-such-exchange", "k")
    channel.queue_unbind("no-such-queue", "amq.direct", "k")


def test_publishing_to_an_internal_exchange_is_refused(
    connection: pika.BlockingConnection, channel: BlockingChannel
) -> None:
    channel.exchange_declare("ix", "fanout", internal=True)
    channel.queue_declare("iq")
    channel.queue_bind("iq", "ix", "")
    closed = channel_error(connection, lambda ch: ch.basic_publish("ix", "", b"m"))
    assert (closed.reply_code, closed.reply_text) == (
        403,
        f"ACCESS_REFUSED - cannot publish to internal exchange 'ix' {VHOST_TEXT}",
    )
    assert message_count(channel, "iq") == 0


def test_unknown_exchange_type_is_a_connection_error(connection: pika.BlockingConnection) -> None:
    closed = connection_error(connection, lambda ch: ch.exchange_declare("bogusx", "bogus"))
    assert (closed.reply_code, closed.reply_text) == (
        503,
        "COMMAND_INVALID - unknown exchange type 'bogus'",
    )


def select_tx_then_confirm(channel: BlockingChannel) -> None:
    channel.tx_select()
    channel.confirm_delivery()


def select_confirm_then_tx(channel: BlockingChannel) -> None:
    channel.confirm_delivery()
    channel.tx_select()


@pytest.mark.parametrize(
    ("action", "text"),
    [
        (select_tx_then_confirm, "cannot switch from tx to confirm mode"),
        (select_confirm_then_tx, "cannot switch from confirm to tx mode"),
    ],
)
def test_tx_and_confirm_modes_exclude_each_other(
    connection: pika.BlockingConnection, action: Callable[[BlockingChannel], None], text: str
) -> None:
    closed = channel_error(connection, action)
    assert (closed.reply_code, closed.reply_text) == (406, f"PRECONDITION_FAILED - {text}")


def test_a_channel_error_leaves_the_connection_usable(
    connection: pika.BlockingConnection,
) -> None:
    closed = channel_error(connection, lambda ch: ch.basic_publish("nowhere", "k", b"lost"))
    assert (closed.reply_code, closed.reply_text) == (
        404,
        f"NOT_FOUND - no exchange 'nowhere' {VHOST_TEXT}",
    )
    channel = connection.channel()
    channel.queue_declare("after")
    channel.basic_publish("", "after", b"still working")
    assert drain_bodies(channel, "after") == [b"still working"]
    closed = channel_error(connection, lambda ch: ch.queue_declare("nope", passive=True))
    assert closed.reply_code == 404
    assert channel.is_open  # only the failing channel closes
    channel.basic_publish("", "after", b"again")
    assert drain_bodies(channel, "after") == [b"again"]


# -- server-named, auto-delete queues ------------------------------------------------------


def test_server_named_queues(channel: BlockingChannel) -> None:
    first = channel.queue_declare("").method.queue
    second = channel.queue_declare("", exclusive=True).method.queue
    for name in (first, second):
        assert name.startswith("amq.gen-")
        assert len(name) == len("amq.gen-") + 22  # RabbitMQ: 16 random bytes, base64url
    assert first != second
    channel.queue_bind(first, "amq.direct", "sn")
    channel.basic_publish("amq.direct", "sn", b"m")
    assert drain_bodies(channel, first) == [b"m"]


def test_an_empty_queue_name_means_the_last_queue_declared(channel: BlockingChannel) -> None:
    channel.queue_declare("")
    channel.queue_bind("", "amq.direct", "last")
    channel.basic_publish("amq.direct", "last", b"m")
    method, _, body = channel.basic_get("", auto_ack=True)
    assert (body, method.message_count) == (b"m", 0)


def test_an_auto_delete_queue_goes_with_its_last_consumer(
    connection: pika.BlockingConnection, channel: BlockingChannel
) -> None:
    channel.queue_declare("adq", auto_delete=True)
    first = channel.basic_consume("adq", lambda *args: None)
    second = channel.basic_consume("adq", lambda *args: None)
    channel.basic_cancel(first)
    assert channel.queue_declare("adq", passive=True).method.consumer_count == 1
    channel.basic_cancel(second)
    closed = channel_error(connection, lambda ch: ch.queue_declare("adq", passive=True))
    assert (closed.reply_code, closed.reply_text) == (
        404,
        f"NOT_FOUND - no queue 'adq' {VHOST_TEXT}",
    )


# -- message sizes -------------------------------------------------------------------------


def test_bodies_larger_than_a_small_frame_max_in_both_directions(
    broker: RunningBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With frame_max 4096, a 100 KiB body crosses in ~25 body frames each way; every frame
    the client decodes must fit in 4096 bytes. pika reads frames through
    `pika.frame.decode_frame`, which records their sizes here."""
    sizes: list[int] = []
    body_frames = 0
    decode = pika.frame.decode_frame

    def recording_decode(data: bytes) -> tuple[int, object]:
        nonlocal body_frames
        used, frame = decode(data)
        if frame is not None:
            sizes.append(used)
            body_frames += isinstance(frame, pika.frame.Body)
        return used, frame

    monkeypatch.setattr(pika.frame, "decode_frame", recording_decode)
    connection = connect(broker, frame_max=4096)
    try:
        assert connection._impl.params.frame_max == 4096  # negotiated
        channel = connection.channel()
        channel.queue_declare("big")
        bodies = [bytes(range(256)) * 400, b"", b"x" * 4096]
        for body in bodies:
            channel.basic_publish("", "big", body, pika.BasicProperties(message_id=str(len(body))))
        got = []
        for method, props, body in channel.consume("big", inactivity_timeout=TIMEOUT_S):
            assert method is not None, "timed out"
            got.append((props.message_id, body))
            channel.basic_ack(method.delivery_tag)
            if len(got) == len(bodies):
                break
        channel.cancel()
        assert got == [(str(len(b)), b) for b in bodies]
        # 102400 bytes at 4088 per body frame (4096 less the frame overhead) take 26 body
        # frames, and 4096 bytes take 2.
        assert body_frames >= 28
        assert max(sizes) <= 4096
    finally:
        connection.close()


# -- routing -------------------------------------------------------------------------------


def test_headers_exchange_any_and_all(channel: BlockingChannel) -> None:
    channel.exchange_declare("hx", "headers")
    channel.queue_declare("h-all")
    channel.queue_declare("h-any")
    channel.queue_bind("h-all", "hx", "", {"x-match": "all", "a": 1, "b": "two"})
    channel.queue_bind("h-any", "hx", "", {"x-match": "any", "a": 1, "b": "two"})
    for name, headers in (
        ("both", {"a": 1, "b": "two"}),
        ("a", {"a": 1}),
        ("b+c", {"b": "two", "c": 3}),
        ("wrong a", {"a": 2}),
        ("empty", {}),
        ("none", None),
    ):
        channel.basic_publish("hx", "", name.encode(), pika.BasicProperties(headers=headers))
    assert drain_bodies(channel, "h-all") == [b"both"]
    assert drain_bodies(channel, "h-any") == [b"both", b"a", b"b+c"]


def test_topic_hash_matches_zero_or_more_words(channel: BlockingChannel) -> None:
    channel.exchange_declare("tx", "topic")
    for queue, pattern in (("t-prefix", "a.#"), ("t-suffix", "#.b"), ("t-middle", "a.#.b")):
        channel.queue_declare(queue)
        channel.queue_bind(queue, "tx", pattern)
    for key in ("a", "b", "a.b", "a.x.b", "a.x.y.b", "x.b", "ab"):
        channel.basic_publish("tx", key, key.encode())
    assert drain_bodies(channel, "t-prefix") == [b"a", b"a.b", b"a.x.b", b"a.x.y.b"]
    assert drain_bodies(channel, "t-suffix") == [b"b", b"a.b", b"a.x.b", b"a.x.y.b", b"x.b"]
    assert drain_bodies(channel, "t-middle") == [b"a.b", b"a.x.b", b"a.x.y.b"]


def test_fanout_copies_to_every_queue_whatever_the_key(channel: BlockingChannel) -> None:
    channel.exchange_declare("fx", "fanout")
    queues = ("f1", "f2", "f3")
    for queue in queues:
        channel.queue_declare(queue)
        channel.queue_bind(queue, "fx", queue)  # the binding key plays no part
    channel.basic_publish("fx", "ignored", b"one")
    channel.basic_publish("fx", "", b"two")
    for queue in queues:
        assert drain_bodies(channel, queue) == [b"one", b"two"]


# -- several channels ----------------------------------------------------------------------


def test_two_channels_interleave_publishes_and_consumes(
    connection: pika.BlockingConnection,
) -> None:
    left = connection.channel()
    right = connection.channel()
    left.queue_declare("to-right")
    right.queue_declare("to-left")
    got: dict[str, list[bytes]] = {"left": [], "right": []}
    left.basic_consume("to-left", lambda ch, m, p, body: got["left"].append(body), auto_ack=True)
    right.basic_consume(
        "to-right", lambda ch, m, p, body: got["right"].append(body), auto_ack=False
    )
    for i in range(20):
        left.basic_publish("", "to-right", f"l{i}".encode())
        right.basic_publish("", "to-left", f"r{i}".encode())
    wait_until(connection, lambda: len(got["left"]) == 20 and len(got["right"]) == 20)
    assert got["left"] == [f"r{i}".encode() for i in range(20)]
    assert got["right"] == [f"l{i}".encode() for i in range(20)]
    right.basic_ack(20, multiple=True)
    left.close()  # closing one channel leaves the other working
    right.basic_publish("", "to-right", b"last")
    wait_until(connection, lambda: len(got["right"]) == 21)
    assert got["right"][-1] == b"last"
