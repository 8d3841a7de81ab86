"""Parsers of configuration values: the text of a flag, an environment variable or an INI
line to the value `streamq serve` runs with.

Pure functions. Each returns the value or raises `ValueError` with a short reason that the
caller prefixes with where the text came from (`FILE:LINE: [section] key:`, the variable's
name, or the flag). It imports nothing of the broker but the size parsers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from streamq.broker.resources import parse_memory_limit, parse_size
from streamq.broker.users import is_password_hash
from streamq.log_output import FORMATS
from streamq.web_origin import canonical as canonical_origin

PORT_MAX: Final = 65535
# Python's logging level names, and LavinMQ's (Crystal's Log::Severity) mapped onto them,
# so that a lavinmq.ini's `log_level = warn` or `notice` carries over.
LOG_LEVELS: Final = {
    "debug": "debug",
    "trace": "debug",
    "info": "info",
    "notice": "info",
    "warning": "warning",
    "warn": "warning",
    "error": "error",
    "critical": "critical",
    "fatal": "critical",
}
LOG_FORMATS: Final = FORMATS  # streamq/log_output.py's
TLS_VERSIONS: Final = ("1.2", "1.3")
_TRUE: Final = frozenset({"true", "yes", "y", "on", "1"})
_FALSE: Final = frozenset({"false", "no", "n", "off", "0"})

Parser = Callable[[str], object]


def text(value: str) -> str:
    return value


def address(value: str) -> str:
    """A listener's address: a host name or an IP address, not empty."""
    if not value.strip() or any(c.isspace() for c in value.strip()):
        raise ValueError(f"not an address: {value!r}")
    return value.strip()


def whole_number(value: str) -> int:
    try:
        return int(value.strip())
    except ValueError:
        raise ValueError(f"not a whole number: {value!r}") from None


def in_range(low: int, high: int) -> Callable[[str], int]:
    """Integers in [low, high]."""

    def parse(value: str) -> int:
        number = whole_number(value)
        if not low <= number <= high:
            raise ValueError(f"out of range {low}-{high}: {number}")
        return number

    return parse


def port(value: str) -> int:
    try:
        number = int(value.strip())
    except ValueError:
        raise ValueError(f"not a port number: {value!r}") from None
    if not 0 <= number <= PORT_MAX:
        raise ValueError(f"port out of range 0-{PORT_MAX}: {number}")
    return number


def optional_port(value: str) -> int:
    """A port, or -1 for a listener that is off (LavinMQ's convention)."""
    if value.strip() == "-1":
        return -1
    try:
        return port(value)
    except ValueError as exc:
        raise ValueError(f"{exc} (or -1: off)") from None


def boolean(value: str) -> bool:
    word = value.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError(f"not a boolean: {value!r} (true or false)")


def proxy_protocol(value: str) -> int:
    """0 (off), 1 or 2 (the PROXY protocol version); LavinMQ's true and false too."""
    word = value.strip().lower()
    if word in ("1", "2"):
        return int(word)
    try:
        return int(boolean(word))
    except ValueError:
        raise ValueError(f"not a PROXY protocol version: {value!r} (0, 1 or 2)") from None


def log_level(value: str) -> str:
    level = LOG_LEVELS.get(value.strip().lower())
    if level is None:
        raise ValueError(f"not a log level: {value!r} ({', '.join(LOG_LEVELS)})")
    return level


def log_format(value: str) -> str:
    word = value.strip().lower()
    if word not in LOG_FORMATS:
        raise ValueError(f"not a log format: {value!r} ({' or '.join(LOG_FORMATS)})")
    return word


def tls_version(value: str) -> str:
    if value.strip() not in TLS_VERSIONS:
        raise ValueError(f"not a TLS version: {value!r} (1.2 or 1.3)")
    return value.strip()


def size(value: str) -> int:
    return parse_size(value)


def bounded_size(low: int, high: int) -> Callable[[str], int]:
    """A size (`128MiB`, `1048576`) in [low, high] bytes."""

    def parse(value: str) -> int:
        number = parse_size(value)
        if not low <= number <= high:
            raise ValueError(f"out of range {low}-{high} bytes: {value.strip()}")
        return number

    return parse


def memory_limit(value: str) -> int:
    return parse_memory_limit(value)


def tcp_uri(value: str) -> str:
    """`tcp://HOST:PORT` (a replication listener's advertised address), or empty."""
    value = value.strip()
    if not value:
        return ""
    rest = value.removeprefix("tcp://")
    if rest == value:
        raise ValueError(f"not a tcp:// URI: {value!r} (tcp://HOST:PORT)")
    _host_port(rest)
    return value


def endpoints(value: str) -> str:
    """A comma-separated list of `HOST:PORT` (or `http://HOST:PORT`), at least one."""
    items = [item.strip() for item in value.split(",") if item.strip()]
    if not items:
        raise ValueError("no endpoint (HOST:PORT[,HOST:PORT...])")
    for item in items:
        _host_port(item.removeprefix("http://"))
    return ",".join(items)


def origins(value: str) -> str:
    """A comma-separated list of web origins (`http://HOST[:PORT]`, `https://...`), each
    made canonical (streamq.web_origin); empty: none."""
    items = [item.strip() for item in value.split(",") if item.strip()]
    canonical = [canonical_origin(item) for item in items]
    for item, origin in zip(items, canonical, strict=True):
        if origin is None:
            raise ValueError(f"not a web origin: {item!r} (http://HOST[:PORT] or https://...)")
    return ",".join(origin for origin in canonical if origin is not None)


def _host_port(text: str) -> None:
    host, _, number = text.rpartition(":")
    if not host or any(c.isspace() or c == "/" for c in host):
        raise ValueError(f"not HOST:PORT: {text!r}")
    port(number)


def key_prefix(value: str) -> str:
    """An etcd key prefix: printable, no spaces, not empty."""
    value = value.strip()
    if not value or not value.isprintable() or any(c.isspace() for c in value):
        raise ValueError(f"not a key prefix: {value!r}")
    return value


def password_hash(value: str) -> str:
    """RabbitMQ's hash: base64 of a 4-byte salt and SHA-256(salt + password)."""
    value = value.strip()
    if not value or not is_password_hash(value):
        raise ValueError(
            "not a rabbit_password_hashing_sha256 hash (base64 of a 4-byte salt and a "
            "32-byte digest; `streamq ctl hash_password PASSWORD` makes one)"
        )
    return value
