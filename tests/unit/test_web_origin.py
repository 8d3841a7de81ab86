"""Web origins (streamq/web_origin.py): canonical spelling, the broker's own origin and
loopback hosts, which decide whether a browser page's WebSocket counts as local."""

from __future__ import annotations

import pytest

from streamq import web_origin


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("http://evil.example", "http://evil.example:80"),
        ("HTTPS://Evil.Example:443/", "https://evil.example:443"),
        ("http://127.0.0.1:15672", "http://127.0.0.1:15672"),
        ("http://[::1]", "http://[::1]:80"),
        ("null", None),  # a file:// page, a sandboxed frame
        ("file://", None),
        ("ws://127.0.0.1:15672", None),
        ("http://a.example/path", None),
        ("http://user@a.example", None),
        ("http://a.example:99999", None),
        ("http://a.example?q", None),
        ("", None),
    ],
)
def test_canonical(text: str, expected: str | None) -> None:
    assert web_origin.canonical(text) == expected


def test_own_origin_is_the_scheme_and_host_header() -> None:
    assert web_origin.own("http", "127.0.0.1:15672") == "http://127.0.0.1:15672"
    assert web_origin.own("https", "LOCALHOST") == "https://localhost:443"
    assert web_origin.own("http", "") is None


@pytest.mark.parametrize(
    ("origin", "loopback"),
    [
        ("http://localhost:80", True),
        ("http://app.localhost:80", True),  # browsers resolve *.localhost to loopback
        ("http://127.0.0.2:15672", True),
        ("http://[::1]:80", True),
        ("http://evil.example:15672", False),  # a name DNS rebinding can point here
        ("http://localhost.evil.example:80", False),
        ("http://10.0.0.1:80", False),
    ],
)
def test_is_loopback(origin: str, loopback: bool) -> None:
    assert web_origin.is_loopback(origin) is loopback
