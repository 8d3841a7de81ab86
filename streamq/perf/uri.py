"""AMQP URIs: `amqp://user:pass@host:port/vhost`, as RabbitMQ's URI spec reads them.

Owns parsing a URI into an `AmqpUri`. An empty or missing path is the default vhost `/`,
and the path is percent-decoded, so `/%2f` is `/` and `/prod` is `prod`. Only the `amqp`
scheme is accepted: the load generator speaks plain TCP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final
from urllib.parse import unquote, urlsplit

from streamq.perf.errors import PerfError

DEFAULT_URI: Final = "amqp://guest:guest@127.0.0.1:5672/%2f"
AMQP_PORT: Final = 5672


@dataclass(frozen=True, slots=True)
class AmqpUri:
    host: str
    port: int
    username: str
    password: str
    vhost: str

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
    if parts.scheme != "amqp":
        raise PerfError(f"bad URI {text!r}: the scheme must be amqp://")
    if not parts.hostname:
        raise PerfError(f"bad URI {text!r}: no host")
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    return AmqpUri(
        host=parts.hostname,
        port=AMQP_PORT if port is None else port,
        username=unquote(parts.username) if parts.username is not None else "guest",
        password=unquote(parts.password) if parts.password is not None else "guest",
        vhost=unquote(path) if path else "/",
    )
