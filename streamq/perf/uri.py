"""AMQP URIs: `amqp://user:pass@host:port/vhost`, as RabbitMQ's URI spec reads them.

Owns parsing a URI into an `AmqpUri`. An empty or missing path is the default vhost `/`,
and the path is percent-decoded, so `/%2f` is `/` and `/prod` is `prod`. The `amqps`
scheme is AMQP over TLS (port 5671 by default), with two of the TLS query parameters of
RabbitMQ's URI spec: `cacertfile` (the CA file that the server's certificate must chain
to; default: the system's) and `verify` (`verify_peer`, the default, or `verify_none`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final
from urllib.parse import parse_qs, unquote, urlsplit

from streamq.perf.errors import PerfError

DEFAULT_URI: Final = "amqp://guest:guest@127.0.0.1:5672/%2f"
AMQP_PORT: Final = 5672
AMQPS_PORT: Final = 5671
VERIFY_MODES: Final = ("verify_peer", "verify_none")


@dataclass(frozen=True, slots=True)
class AmqpUri:
    host: str
    port: int
    username: str
    password: str
    vhost: str
    tls: bool = False  # amqps://
    cacertfile: str = ""  # "": the system's CA certificates
    verify: bool = True  # check the server's certificate and name

    def address(self) -> str:
        return f"{self.host}:{self.port}"


def parse_uri(text: str) -> AmqpUri:
    """Parse an AMQP URI. Raises `PerfError` for another scheme, a missing host or a bad
    port."""
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise PerfError(f"bad URI {text!r}: {exc}") from None
    if parts.scheme not in ("amqp", "amqps"):
        raise PerfError(f"bad URI {text!r}: the scheme must be amqp:// or amqps://")
    if not parts.hostname:
        raise PerfError(f"bad URI {text!r}: no host")
    tls = parts.scheme == "amqps"
    cacertfile, verify = parse_tls_query(text, parts.query, tls)
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    return AmqpUri(
        host=parts.hostname,
        port=(AMQPS_PORT if tls else AMQP_PORT) if port is None else port,
        username=unquote(parts.username) if parts.username is not None else "guest",
        password=unquote(parts.password) if parts.password is not None else "guest",
        vhost=unquote(path) if path else "/",
        tls=tls,
        cacertfile=cacertfile,
        verify=verify,
    )


def parse_tls_query(
    text: str, query: str, tls: bool, tls_scheme: str = "amqps"
) -> tuple[str, bool]:
    """`cacertfile` and `verify` from the query (also of `streamq perf mqtt`'s URIs).
    Raises `PerfError` for another key, a bad verify mode, or TLS parameters on a URI
    whose scheme is not `tls_scheme`."""
    try:
        fields = parse_qs(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise PerfError(f"bad URI {text!r}: malformed query") from None
    unknown = sorted(set(fields) - {"cacertfile", "verify"})
    if unknown:
        raise PerfError(f"bad URI {text!r}: unsupported query parameter {unknown[0]!r}")
    if fields and not tls:
        raise PerfError(f"bad URI {text!r}: TLS parameters need {tls_scheme}://")
    verify = fields.get("verify", ["verify_peer"])[-1]
    if verify not in VERIFY_MODES:
        raise PerfError(f"bad URI {text!r}: verify must be verify_peer or verify_none")
    return fields.get("cacertfile", [""])[-1], verify == "verify_peer"
