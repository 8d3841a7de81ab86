"""Web origins (RFC 6454): the `scheme://host:port` a browser names in an `Origin` header.

Owns parsing an origin to its canonical text (lower-case scheme and host, the port always
written, IPv6 hosts in brackets) so that `http://LOCALHOST` and `http://localhost:80` are
one origin, and the questions the WebSocket upgrade asks of one: whether it is the
broker's own (the request's scheme and `Host`) and whether its host is this machine's
loopback. Pure functions; nothing here knows HTTP requests or connections.
"""

from __future__ import annotations

import ipaddress
from typing import Final
from urllib.parse import urlsplit

DEFAULT_PORTS: Final = {"http": 80, "https": 443}
LOCALHOST: Final = "localhost"


def canonical(text: str) -> str | None:
    """`text` as `scheme://host:port`, or None if it is not an http(s) origin (a path,
    credentials, a query or a fragment, or the opaque origin `null`, are not)."""
    try:
        parts = urlsplit(text.strip())
        port = parts.port
    except ValueError:
        return None
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    if scheme not in DEFAULT_PORTS or not host or parts.username is not None:
        return None
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return None
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{DEFAULT_PORTS[scheme] if port is None else port}"


def own(scheme: str, host_header: str) -> str | None:
    """The origin of a page served by this request's server: its scheme (`http` or
    `https`) and its `Host` header; None if the header is not a host."""
    return canonical(f"{scheme}://{host_header}") if host_header else None


def is_loopback(origin: str) -> bool:
    """Whether a canonical origin's host is this machine by name or address (localhost,
    127.0.0.0/8, ::1): a page of it is served from this machine, not from a name that a
    DNS rebinding can point at it."""
    host = urlsplit(origin).hostname or ""
    if host == LOCALHOST or host.endswith("." + LOCALHOST):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
