"""The connection-level handshake of AMQP 0-9-1, as pure functions (sans-IO).

Owns what the handshake methods say, both ways: connection.start (the SASL mechanisms
and capabilities offered), the parsing of start-ok's response into a login request
(PLAIN, AMQPLAIN, and EXTERNAL where it is offered), connection.tune, and the limits a
tune-ok must respect, in RabbitMQ 3.10's words. It holds no state: the connection state
machine (amqp_gateway/connection.py) decides when each step applies and records what it
agreed; the server decides whether a login or an open is allowed (amqp_gateway/access.py).
"""

from __future__ import annotations

from typing import Final

from amqp_gateway import codec
from amqp_gateway.codec import methods as m
from amqp_gateway.codec.values import read_table
from amqp_gateway.errors import AMQPSyntaxError, CommandInvalid, NotAllowed
from amqp_gateway.events import LoginRequested
from amqp_gateway.tuning import AmqpTuning

MECHANISMS: Final = b"PLAIN AMQPLAIN"  # SASL mechanisms offered on every connection

SERVER_CAPABILITIES: Final[dict[str, codec.FieldValue]] = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "consumer_priorities": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
    "direct_reply_to": True,
}


def connection_start(server_properties: codec.FieldTable, mechanisms: bytes) -> m.ConnectionStart:
    """What the server sends once the client's protocol header is read."""
    return m.ConnectionStart(
        version_major=0,
        version_minor=9,
        server_properties=server_properties,
        mechanisms=mechanisms,
        locales=b"en_US",
    )


def login_request(method: m.ConnectionStartOk, mechanisms: bytes) -> LoginRequested:
    """The login that start-ok asks for, with one of the `mechanisms` offered.

    Raises AMQPSyntaxError for a malformed PLAIN response and CommandInvalid for a
    mechanism that is unknown or not offered on this connection."""
    mechanism = method.mechanism
    if mechanism == "PLAIN":
        parts = method.response.split(b"\x00")
        if len(parts) != 3:
            raise AMQPSyntaxError("malformed PLAIN response", 10, 11)
        username, password = parts[1], parts[2]
        return LoginRequested(mechanism, _utf8(username), _utf8(password), method.client_properties)
    if mechanism == "AMQPLAIN":
        # The response is a field table without its length prefix.
        table = _amqplain_table(method.response)
        return LoginRequested(
            mechanism,
            _field_str(table.get("LOGIN")),
            _field_str(table.get("PASSWORD")),
            method.client_properties,
        )
    if mechanism == "EXTERNAL" and mechanism.encode() in mechanisms.split():
        # The user is the client certificate's, which the server knows: the
        # response (pika sends none) is not read, as in RabbitMQ's EXTERNAL.
        return LoginRequested(mechanism, "", "", method.client_properties)
    if mechanism == "EXTERNAL":
        # Known but not offered here (plain TCP, no client certificate): RabbitMQ's
        # rabbit_reader:auth_mechanism_to_module/2 text for that case.
        raise CommandInvalid(f"invalid authentication mechanism '{mechanism}'", 10, 11)
    raise CommandInvalid(f"unknown authentication mechanism '{mechanism}'", 10, 11)


def connection_tune(offer: AmqpTuning) -> m.ConnectionTune:
    """What the server offers once the login is accepted."""
    return m.ConnectionTune(
        channel_max=offer.channel_max,
        frame_max=offer.frame_max,
        heartbeat=offer.heartbeat_s,
    )


def check_tune_ok(method: m.ConnectionTuneOk, offer: AmqpTuning) -> None:
    """Raises NotAllowed for a tune-ok that asks for more than `offer`, or a frame_max
    under the spec's minimum."""
    # 0 means "no limit", which is above ours: RabbitMQ 3.10 refuses it too
    # (rabbit_reader:validate_negotiated_integer_value/3).
    if method.channel_max > offer.channel_max or method.channel_max == 0:
        raise NotAllowed(
            f"negotiated channel_max = {method.channel_max} is higher than the maximum "
            f"allowed value ({offer.channel_max})",
            10,
            31,
        )
    if method.frame_max > offer.frame_max or method.frame_max == 0:
        raise NotAllowed(
            f"negotiated frame_max = {method.frame_max} is higher than the maximum "
            f"allowed value ({offer.frame_max})",
            10,
            31,
        )
    if 0 < method.frame_max < codec.FRAME_MIN_SIZE:
        raise NotAllowed(
            f"negotiated frame_max = {method.frame_max} is lower than the minimum "
            f"allowed value ({codec.FRAME_MIN_SIZE})",
            10,
            31,
        )


def _utf8(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


def _amqplain_table(response: bytes) -> codec.FieldTable:
    length = len(response).to_bytes(4, "big")
    table, _ = read_table(length + response, 0)
    return table


def _field_str(value: object) -> str:
    if isinstance(value, bytes):
        return _utf8(value)
    return str(value) if value is not None else ""
