"""The connection's handshake and life: peer properties, SASL, Tune, Open, Heartbeat, Close.

Owns the server's side of RabbitMQ's stream handshake (PeerProperties -> SaslHandshake ->
SaslAuthenticate -> Tune both ways -> Open), the users and vhost permissions it checks
(the same accounts as AMQP's: PLAIN and AMQPLAIN by password, EXTERNAL by a verified TLS
client certificate's CN), the negotiated frame_max and heartbeat, ExchangeCommandVersions,
and Close in both directions. A refused login answers with its SASL code and closes.
"""

from __future__ import annotations

import logging
import struct
from typing import TYPE_CHECKING, Final

from stream_gateway import client_view
from stream_gateway.codec import commands as c
from stream_gateway.codec.constants import VERSION_1, VERSION_2, Key, ResponseCode
from streamq import __version__
from streamq.broker.errors import BrokerError
from streamq.broker.users import login_allowed
from streamq.log_fields import USER
from streamq.tls_peer import certificate_cn

if TYPE_CHECKING:
    from stream_gateway.session import StreamSession

logger = logging.getLogger(__name__)

OK: Final = ResponseCode.OK
MECHANISMS: Final = ("PLAIN", "AMQPLAIN")
EXTERNAL: Final = "EXTERNAL"
# Java and .NET clients read the broker's `version` to decide whether it speaks
# ExchangeCommandVersions (3.11+), filtering and super streams (3.13): this gateway speaks
# what RabbitMQ 3.13's stream plugin does, so it says so; `streamq_version` is ours.
RABBITMQ_COMPATIBLE_VERSION: Final = "3.13.0"
FRAME_MAX_MIN: Final = 1024  # a smaller negotiated frame_max is raised to this

# What ExchangeCommandVersions advertises, key by key from 1 with no gap: rstream looks a
# key up at index key - 1 of the list.
COMMAND_VERSIONS: Final = tuple(
    c.CommandVersion(key, VERSION_1, VERSION_2 if key in (Key.PUBLISH, Key.DELIVER) else VERSION_1)
    for key in range(Key.DECLARE_PUBLISHER, Key.DELETE_SUPER_STREAM + 1)
)


def server_properties() -> dict[str, str]:
    return {
        "product": "streamq",
        "version": RABBITMQ_COMPATIBLE_VERSION,
        "streamq_version": __version__,
        "platform": "Python",
        "information": "A streaming-first AMQP 0-9-1 broker with RabbitMQ's stream protocol",
        "cluster_name": "streamq",
    }


def peer_properties(s: StreamSession, m: c.PeerProperties) -> None:
    from stream_gateway.session import State  # noqa: PLC0415

    s.client_properties = dict(m.properties)
    s.send(c.PeerPropertiesResponse(m.correlation_id, OK, server_properties()))
    s.state = State.SASL_HANDSHAKE


def mechanisms(s: StreamSession) -> tuple[str, ...]:
    if certificate_cn(s.transport) is not None:
        return (*MECHANISMS, EXTERNAL)
    return MECHANISMS


def sasl_handshake(s: StreamSession, m: c.SaslHandshake) -> None:
    from stream_gateway.session import State  # noqa: PLC0415

    s.send(c.SaslHandshakeResponse(m.correlation_id, OK, mechanisms(s)))
    s.state = State.SASL_AUTHENTICATE


def sasl_authenticate(s: StreamSession, m: c.SaslAuthenticate) -> None:
    """Log in, then offer Tune; a refusal answers with its code and closes."""
    from stream_gateway.session import State  # noqa: PLC0415

    code, user = _login(s, m)
    if code != OK:
        logger.warning(
            "stream login refused for %s from %s (%s)",
            user,
            s.peer,
            code.name,
            extra={**s.log_fields(), USER: user},
        )
        s.send(c.SaslAuthenticateResponse(m.correlation_id, code))
        s.close_now()
        return
    s.user = user
    s.auth_mechanism = m.mechanism
    s.send(c.SaslAuthenticateResponse(m.correlation_id, OK))
    s.send(c.Tune(s.gateway.frame_max, s.gateway.heartbeat_s))
    s.state = State.TUNE


def _login(s: StreamSession, m: c.SaslAuthenticate) -> tuple[ResponseCode, str]:
    """(OK, user) or (the refusal's code, the name tried)."""
    if m.mechanism not in mechanisms(s):
        return ResponseCode.SASL_MECHANISM_NOT_SUPPORTED, "?"
    accounts = s.broker.accounts
    if m.mechanism == EXTERNAL:
        name = certificate_cn(s.transport) or ""
        found = accounts.user(name)
    else:
        credentials = sasl_credentials(m.mechanism, m.data or b"")
        if credentials is None:
            return ResponseCode.SASL_ERROR, "?"
        name, password = credentials
        found = accounts.authenticate(name, password)
    if found is None:
        return ResponseCode.AUTHENTICATION_FAILURE, name
    loopback = s.peer_host in ("127.0.0.1", "::1") or s.peer_host.startswith("127.")
    if not login_allowed(found.name, loopback):
        return ResponseCode.SASL_AUTHENTICATION_FAILURE_LOOPBACK, name
    return OK, found.name


def sasl_credentials(mechanism: str, data: bytes) -> tuple[str, str] | None:
    """User and password of a PLAIN (authzid NUL user NUL password) or AMQPLAIN (an AMQP
    field table without its length: LOGIN and PASSWORD as long strings) response."""
    try:
        if mechanism == "PLAIN":
            parts = data.split(b"\x00")
            if len(parts) != 3:
                return None
            return parts[1].decode(), parts[2].decode()
        table = _amqplain(data)
        return table["LOGIN"], table["PASSWORD"]
    except (UnicodeDecodeError, KeyError, struct.error, ValueError):
        return None


def _amqplain(data: bytes) -> dict[str, str]:
    table: dict[str, str] = {}
    position = 0
    while position < len(data):
        size = data[position]
        key = data[position + 1 : position + 1 + size].decode()
        position += 1 + size
        if data[position : position + 1] != b"S":
            raise ValueError("AMQPLAIN: only long strings are read")
        (length,) = struct.unpack_from(">I", data, position + 1)
        position += 5
        table[key] = data[position : position + length].decode()
        position += length
    return table


def tune(s: StreamSession, m: c.Tune | c.TuneResponse) -> None:
    """The client's Tune (clients send it with the request key, RabbitMQ accepts both):
    the lower non-zero values of both sides apply."""
    from stream_gateway.session import State  # noqa: PLC0415

    s.frame_max = max(FRAME_MAX_MIN, _lower(s.gateway.frame_max, m.frame_max))
    s.heartbeat_s = _lower(s.gateway.heartbeat_s, m.heartbeat_s)
    s.state = State.OPEN


def _lower(ours: int, theirs: int) -> int:
    if ours == 0 or theirs == 0:
        return ours or theirs
    return min(ours, theirs)


def open_vhost(s: StreamSession, m: c.Open) -> None:
    """Open in the vhost, with RabbitMQ's advertised_host/advertised_port properties."""
    try:
        vhost = s.broker.vhost(m.vhost)
    except BrokerError:
        vhost = None
    if vhost is None or not s.broker.accounts.vhost_access(s.user, m.vhost):
        s.send(c.OpenResponse(m.correlation_id, ResponseCode.VIRTUAL_HOST_ACCESS_FAILURE))
        s.close_now()
        return
    s.vhost = vhost
    host, port = s.gateway.advertised(s)
    properties = {"advertised_host": host, "advertised_port": str(port)}
    s.send(c.OpenResponse(m.correlation_id, OK, properties))
    s.opened()
    # Counted towards the vhost's and user's max-connections (AMQP opens meet them), but
    # never refused by them: RabbitMQ 3.10's stream reader tracks, and does not check.
    s.broker.tracking.add(s, vhost.name, s.user)
    client_view.register(s)


def heartbeat(s: StreamSession, m: c.Heartbeat) -> None:
    """Reading anything counts as a heartbeat (the session notes the time)."""


def close(s: StreamSession, m: c.Close) -> None:
    if m.closing_code != OK:
        logger.info(
            "stream connection %s closed by peer: %s", s.peer, m.reason, extra=s.log_fields()
        )
    s.send(c.Response(Key.CLOSE, m.correlation_id, OK))
    s.close_now()


def response(s: StreamSession, m: c.Response) -> None:
    """A response to a request this server did not send (ours are handled where they
    are awaited): RabbitMQ ignores it, and so do we."""
    if m.key == Key.CLOSE:
        s.close_now()


def exchange_command_versions(s: StreamSession, m: c.ExchangeCommandVersions) -> None:
    for version in m.versions:
        if version.key == Key.DELIVER and version.version_max >= VERSION_2:
            s.deliver_v2 = True
    s.send(c.ExchangeCommandVersionsResponse(m.correlation_id, OK, COMMAND_VERSIONS))
