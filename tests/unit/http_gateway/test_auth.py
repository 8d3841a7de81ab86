"""Basic-auth parsing and the slowing down of repeated failed logins (no sockets, no sleeps:
time is passed in)."""

from __future__ import annotations

import base64
import itertools

import pytest

from http_gateway import auth
from http_gateway.auth import FailedLogins, credentials


def basic(text: str) -> str:
    return "Basic " + base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (basic("guest:guest"), ("guest", "guest")),
        (basic("user:pass:with:colons"), ("user", "pass:with:colons")),
        (basic("user:"), ("user", "")),
        (basic(":"), ("", "")),
        (basic("héllo:pässword"), ("héllo", "pässword")),
        ("basic " + base64.b64encode(b"a:b").decode(), ("a", "b")),  # the scheme is case-free
        ("Basic  " + base64.b64encode(b"a:b").decode() + " ", ("a", "b")),
    ],
)
def test_credentials_are_parsed(header: str, expected: tuple[str, str]) -> None:
    assert credentials(header) == expected


@pytest.mark.parametrize(
    "header",
    [
        "",
        "Basic",
        basic("no-colon"),
        "Bearer " + base64.b64encode(b"a:b").decode(),
        "Basic not*base64",
        "Basic " + base64.b64encode(b"\xff\xfe:x").decode(),  # not UTF-8
        "Basic Z3Vlc3Q6Z3Vlc3Q\u00e9",  # a character outside ASCII: b64decode's ValueError
    ],
)
def test_bad_headers_give_no_credentials(header: str) -> None:
    assert credentials(header) is None


def test_failures_beyond_the_free_ones_wait_longer_each_time_up_to_a_cap() -> None:
    logins = FailedLogins()
    now = 100.0
    delays = []
    for _ in range(12):
        delays.append(logins.delay_s("10.0.0.1", now))
        logins.failed("10.0.0.1", now)
    free = auth.FAILURES_FREE
    assert delays[:free] == [0.0] * free
    assert delays[free] == auth.DELAY_S_BASE
    assert delays[free + 1] == 2 * auth.DELAY_S_BASE
    assert all(a <= b for a, b in itertools.pairwise(delays))
    assert delays[-1] == auth.DELAY_S_MAX
    assert logins.delay_s("10.0.0.2", now) == 0.0  # per address


def test_a_quiet_period_forgets_the_failures() -> None:
    logins = FailedLogins()
    for _ in range(auth.FAILURES_FREE + 2):
        logins.failed("b", 0.0)
    assert logins.delay_s("b", 1.0) > 0
    later = auth.FAILURE_MEMORY_S + 1.0
    assert logins.delay_s("b", later) == 0.0
    logins.failed("b", later)  # counting starts again
    assert logins.delay_s("b", later) == 0.0


def test_the_table_of_addresses_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auth, "ADDRESSES_MAX", 3)
    logins = FailedLogins()
    for _ in range(auth.FAILURES_FREE):
        logins.failed("oldest", 0.0)
    for address in ("b", "c", "d"):
        logins.failed(address, 0.0)
    assert logins.delay_s("oldest", 0.0) == 0.0  # evicted first
