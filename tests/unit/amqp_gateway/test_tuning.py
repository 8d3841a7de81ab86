"""amqp_gateway.tuning: the ranges of heartbeat, frame_max, channel_max and
max_message_size (RabbitMQ's and LavinMQ's), and a Connection that offers and enforces
a tuning other than the defaults."""

from __future__ import annotations

import pytest

from amqp_gateway import codec
from amqp_gateway.codec import methods as m
from amqp_gateway.connection import CHANNEL_MAX, FRAME_MAX, HEARTBEAT_S, Connection
from amqp_gateway.events import ConnectionClosed
from amqp_gateway.states import State
from amqp_gateway.tuning import (
    FRAME_MAX_LIMIT,
    MESSAGE_BYTES_MAX_LIMIT,
    AmqpTuning,
)
from tests.unit.amqp_gateway.test_connection import Client, publish_frames


def test_the_defaults_are_rabbitmqs_and_in_range() -> None:
    tuning = AmqpTuning()
    assert (tuning.heartbeat_s, tuning.frame_max, tuning.channel_max) == (60, 131072, 2047)
    assert (HEARTBEAT_S, FRAME_MAX, CHANNEL_MAX) == (60, 131072, 2047)
    assert tuning.message_bytes_max == 128 * 1024 * 1024
    tuning.check()


@pytest.mark.parametrize(
    "tuning",
    [
        AmqpTuning(heartbeat_s=0),
        AmqpTuning(heartbeat_s=65535),
        AmqpTuning(frame_max=4096),
        AmqpTuning(frame_max=FRAME_MAX_LIMIT),
        AmqpTuning(channel_max=1),
        AmqpTuning(channel_max=65535),
        AmqpTuning(message_bytes_max=1),
        AmqpTuning(message_bytes_max=MESSAGE_BYTES_MAX_LIMIT),
    ],
)
def test_the_range_ends_are_accepted(tuning: AmqpTuning) -> None:
    tuning.check()


@pytest.mark.parametrize(
    ("tuning", "message"),
    [
        (AmqpTuning(heartbeat_s=-1), "heartbeat must be between 0 and 65535, not -1"),
        (AmqpTuning(heartbeat_s=65536), "heartbeat must be between 0 and 65535, not 65536"),
        (AmqpTuning(frame_max=4095), "frame_max must be between 4096 and 16777216, not 4095"),
        (AmqpTuning(frame_max=0), "frame_max must be between 4096 and 16777216, not 0"),
        (AmqpTuning(frame_max=FRAME_MAX_LIMIT + 1), "frame_max must be between"),
        (AmqpTuning(channel_max=0), "channel_max must be between 1 and 65535, not 0"),
        (AmqpTuning(channel_max=65536), "channel_max must be between 1 and 65535, not 65536"),
        (AmqpTuning(message_bytes_max=0), "max_message_size must be between 1 and 536870912"),
        (AmqpTuning(message_bytes_max=MESSAGE_BYTES_MAX_LIMIT + 1), "max_message_size"),
        (AmqpTuning(frame_max="8192"), "frame_max must be an integer, not '8192'"),  # type: ignore[arg-type]
        (AmqpTuning(heartbeat_s=True), "heartbeat must be an integer, not True"),
    ],
)
def test_values_out_of_range_are_refused_by_name(tuning: AmqpTuning, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        tuning.check()


def tuned_client(tuning: AmqpTuning) -> Client:
    client = Client()
    client.server = Connection({"product": "streamq"}, 0.0, tuning)
    return client


def offered_tune(client: Client) -> m.ConnectionTune:
    client.send(b"AMQP\x00\x00\x09\x01")
    client.send_method(0, m.ConnectionStartOk(mechanism="PLAIN", response=b"\x00u\x00p"))
    client.server.accept_login("u")
    [_, (_, tune)] = client.methods()
    assert isinstance(tune, m.ConnectionTune)
    return tune


def test_the_connection_offers_its_tuning() -> None:
    client = tuned_client(AmqpTuning(heartbeat_s=7, frame_max=8192, channel_max=5))
    tune = offered_tune(client)
    assert (tune.heartbeat, tune.frame_max, tune.channel_max) == (7, 8192, 5)
    client.send_method(0, m.ConnectionTuneOk(5, 8192, 7))
    assert client.server.state is State.AWAIT_OPEN
    assert (client.server.channel_max, client.server.frame_max) == (5, 8192)


@pytest.mark.parametrize(
    ("tune_ok", "text"),
    [
        (
            m.ConnectionTuneOk(6, 8192, 7),
            "channel_max = 6 is higher than the maximum allowed value (5)",
        ),
        (
            m.ConnectionTuneOk(5, 8193, 7),
            "frame_max = 8193 is higher than the maximum allowed value (8192)",
        ),
    ],
)
def test_a_tune_ok_above_the_offer_is_530(tune_ok: m.ConnectionTuneOk, text: str) -> None:
    # Before connection.open the refusal closes the socket without a close method, as
    # RabbitMQ does (states.py, SILENT_STATES).
    client = tuned_client(AmqpTuning(heartbeat_s=7, frame_max=8192, channel_max=5))
    offered_tune(client)
    [closed] = client.send_method(0, tune_ok)
    assert isinstance(closed, ConnectionClosed) and closed.reply_code == 530
    assert text in closed.reply_text
    assert client.server.state is State.CLOSED


def test_a_message_over_the_tuned_max_size_is_406_as_with_the_default() -> None:
    client = tuned_client(AmqpTuning(message_bytes_max=100))
    client.open()
    client.send(publish_frames(1, b"x" * 100))  # at the limit: accepted
    assert client.methods() == []
    client.send(publish_frames(1, b"x" * 101))
    [(channel, close)] = client.methods()
    assert channel == 1 and isinstance(close, m.ChannelClose) and close.reply_code == 406
    assert close.reply_text == (
        "PRECONDITION_FAILED - message size 101 is larger than configured max size 100"
    )
    assert (close.class_id, close.method_id) == (60, 40)
    assert codec.FRAME_MIN_SIZE == 4096
