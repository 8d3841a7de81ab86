"""AMQP URIs as RabbitMQ's URI spec and its Erlang client read them.

Owns `parse_uri`, from `amqp[s]://user:pass@host:port/vhost?key=value&...` to an
`AmqpUri`; its errors show the URI with the password hidden by the broker's
`redact_uri` (link_definitions.py), as status pages do.
Defaults are the Erlang client's: user and password `guest`, port 5672 (5671 for
amqps), the vhost `/` when the path is empty, percent-decoding of every part (so
`/%2f` is `/`), a heartbeat of 10 s and a connection timeout of 60 s. `amqp://` with no
host at all is this broker, reached by a direct connection (RabbitMQ's
`amqp_params_direct`). The TLS query parameters (`cacertfile`, `certfile`, `keyfile`,
`verify`, `server_name_indication`) build the `ssl.SSLContext` here, so that a bad file
is refused when the URI is parsed, not later at every reconnect. It opens no socket.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from streamq.broker.link_definitions import redact_uri

AMQP_PORT: Final = 5672
AMQPS_PORT: Final = 5671
HEARTBEAT_S_DEFAULT: Final = 10
CONNECTION_TIMEOUT_S_DEFAULT: Final = 60.0
HEARTBEAT_S_MAX: Final = 65535  # a short in connection.tune
VERIFY_MODES: Final = ("verify_peer", "verify_none")
AUTH_MECHANISMS: Final = {"plain": "PLAIN", "amqplain": "PLAIN", "external": "EXTERNAL"}
# RabbitMQ's query parameters that need TLS, and those that do not.
_TLS_KEYS: Final = frozenset(
    {
        "cacertfile",
        "certfile",
        "keyfile",
        "verify",
        "server_name_indication",
        "fail_if_no_peer_cert",
        "depth",
    }
)
_PLAIN_KEYS: Final = frozenset(
    {"heartbeat", "connection_timeout", "channel_max", "frame_max", "auth_mechanism"}
)


class UriInvalid(ValueError):
    """A URI that cannot be used; the message says why (never with its password)."""


@dataclass(frozen=True)
class AmqpUri:
    """A parsed AMQP URI. `str()` and `repr()` never show the password."""

    scheme: str  # "amqp" or "amqps"
    host: str  # "" when `local`
    port: int
    vhost: str
    username: str
    password: str = field(repr=False)
    heartbeat_s: int = HEARTBEAT_S_DEFAULT  # 0: no heartbeats
    connection_timeout_s: float = CONNECTION_TIMEOUT_S_DEFAULT
    tls: ssl.SSLContext | None = field(default=None, compare=False)
    server_hostname: str | None = None  # SNI and the name the certificate must carry
    local: bool = False  # "amqp://" with no host: this broker, by a direct connection
    channel_max: int = 0  # 0: what the server offers
    frame_max: int = 0  # 0: the client's default
    auth_mechanism: str = "PLAIN"  # or "EXTERNAL" (the client certificate's name)
    text: str = field(default="", compare=False)  # the URI as given, password redacted

    def __str__(self) -> str:
        return self.text

    def address(self) -> str:
        """ "host:port" for messages ("direct" for this broker)."""
        if self.local:
            return "direct"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_uri(text: str) -> AmqpUri:
    """Parse an AMQP URI. Raises `UriInvalid` for another scheme, a bad port, an unknown
    or bad query parameter, TLS parameters on amqp://, or a TLS file that cannot be read."""
    shown = redact_uri(text)
    try:
        parts = urlsplit(text)
        port = parts.port
        hostname = unquote(parts.hostname or "")
    except ValueError as exc:
        raise UriInvalid(f"bad URI {shown!r}: {exc}") from None
    if parts.scheme not in ("amqp", "amqps"):
        raise UriInvalid(f"bad URI {shown!r}: the scheme must be amqp:// or amqps://")
    if parts.fragment:
        raise UriInvalid(f"bad URI {shown!r}: a fragment (#...) is not allowed")
    tls = parts.scheme == "amqps"
    query = _query(shown, parts.query, tls)
    # No host (user information alone is allowed): this broker, as RabbitMQ's direct.
    local = not hostname
    if local and (tls or port is not None):
        raise UriInvalid(f"bad URI {shown!r}: a port or amqps:// needs a host")
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if "/" in path:
        raise UriInvalid(f"bad URI {shown!r}: a '/' in the vhost must be written %2f")
    mechanism = AUTH_MECHANISMS.get(query.get("auth_mechanism", "plain").lower())
    if mechanism is None:
        raise UriInvalid(f"bad URI {shown!r}: auth_mechanism must be plain or external")
    context, server_hostname = _tls(shown, query, hostname) if tls else (None, None)
    return AmqpUri(
        scheme=parts.scheme,
        host=hostname,
        port=(AMQPS_PORT if tls else AMQP_PORT) if port is None else port,
        vhost=unquote(path) if path else "/",
        username=unquote(parts.username) if parts.username is not None else "guest",
        password=unquote(parts.password) if parts.password is not None else "guest",
        heartbeat_s=_int(shown, query, "heartbeat", HEARTBEAT_S_DEFAULT, HEARTBEAT_S_MAX),
        connection_timeout_s=_timeout_s(shown, query),
        tls=context,
        server_hostname=server_hostname,
        local=local,
        channel_max=_int(shown, query, "channel_max", 0, 65535),
        frame_max=_int(shown, query, "frame_max", 0, 1 << 31),
        auth_mechanism=mechanism,
        text=shown,
    )


def _query(shown: str, query: str, tls: bool) -> dict[str, str]:
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise UriInvalid(f"bad URI {shown!r}: malformed query") from None
    fields = dict(pairs)
    for key in fields:
        if key in _TLS_KEYS and not tls:
            raise UriInvalid(f"bad URI {shown!r}: {key} needs amqps://")
        if key not in _TLS_KEYS and key not in _PLAIN_KEYS:
            raise UriInvalid(f"bad URI {shown!r}: unsupported query parameter {key!r}")
    return fields


def _int(shown: str, query: dict[str, str], key: str, default: int, maximum: int) -> int:
    raw = query.get(key)
    if raw is None:
        return default
    if not raw.isdigit() or int(raw) > maximum:
        raise UriInvalid(f"bad URI {shown!r}: {key} must be an integer from 0 to {maximum}")
    return int(raw)


def _timeout_s(shown: str, query: dict[str, str]) -> float:
    """RabbitMQ's connection_timeout is in milliseconds; "infinity" is refused here, since
    a link that never gives up on a connect would never report it."""
    raw_ms = _int(shown, query, "connection_timeout", 0, 1 << 31)
    if "connection_timeout" not in query:
        return CONNECTION_TIMEOUT_S_DEFAULT
    if raw_ms == 0:
        raise UriInvalid(f"bad URI {shown!r}: connection_timeout must be above 0 ms")
    return raw_ms / 1000


def _tls(shown: str, query: dict[str, str], hostname: str) -> tuple[ssl.SSLContext, str]:
    """The client context of an amqps:// URI and the server name to send and check."""
    verify = query.get("verify", "verify_peer")
    if verify not in VERIFY_MODES:
        raise UriInvalid(f"bad URI {shown!r}: verify must be verify_peer or verify_none")
    cafile = query.get("cacertfile") or None
    try:
        context = ssl.create_default_context(cafile=cafile)
    except (OSError, ssl.SSLError) as exc:
        raise UriInvalid(f"bad URI {shown!r}: cannot read cacertfile {cafile!r}: {exc}") from None
    if verify == "verify_none":
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    certfile, keyfile = query.get("certfile"), query.get("keyfile")
    if keyfile and not certfile:
        raise UriInvalid(f"bad URI {shown!r}: keyfile needs certfile")
    if certfile:
        try:
            context.load_cert_chain(certfile, keyfile or None)
        except (OSError, ssl.SSLError) as exc:
            raise UriInvalid(
                f"bad URI {shown!r}: cannot read certfile {certfile!r}: {exc}"
            ) from None
    return context, query.get("server_name_indication") or hostname


def quote_vhost(vhost: str) -> str:
    """The vhost as a URI path segment ("/" is "%2F"), for building URIs in tests and UIs."""
    return quote(vhost, safe="")
