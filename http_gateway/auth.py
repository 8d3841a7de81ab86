"""HTTP basic authentication for the management API, with failed logins slowed down.

Owns who a request comes from: the `Authorization: Basic` header checked against the
broker's users (RabbitMQ's salted sha256 hashes), the loopback rule for `guest`, and the
management tag a user needs to use the API at all (RabbitMQ: "Not management user").
Wrong credentials get one answer whatever part was wrong. After `FAILURES_FREE` failures
from one address, each further failed attempt is answered only after a growing delay
(`delay_s`), up to `DELAY_S_MAX`: refusals stay quick, and nothing is ever locked out. A
right password is never delayed, from that address or any other; it does not forget the
address's failures either (else a guesser holding any account could reset its own count),
which `FAILURE_MEMORY_S` without a failure does. The delay is a sleep of the request
alone: the event loop serves everyone else meanwhile. The table of addresses is bounded
(`ADDRESSES_MAX`), oldest evicted first.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import time
from collections import OrderedDict
from typing import Final

from aiohttp import web

from http_gateway.context import BROKER_KEY, CALLER_KEY, MANAGEMENT_TAGS, Caller
from http_gateway.errors import HttpError
from streamq.broker.users import User, login_allowed

FAILURES_FREE: Final = 3
DELAY_S_BASE: Final = 0.25
DELAY_S_MAX: Final = 0.5  # every refusal is answered within about half a second
FAILURE_MEMORY_S: Final = 300.0
ADDRESSES_MAX: Final = 10_000


class FailedLogins:
    """Recent failed logins per remote address, for slowing down password guessing."""

    def __init__(self) -> None:
        self._failures: OrderedDict[str, tuple[int, float]] = OrderedDict()

    def delay_s(self, address: str, now: float) -> float:
        """How long to hold the answer to another failed attempt from `address`."""
        count, last = self._failures.get(address, (0, now))
        if now - last > FAILURE_MEMORY_S or count < FAILURES_FREE:
            return 0.0
        return min(DELAY_S_BASE * 2.0 ** (count - FAILURES_FREE), DELAY_S_MAX)

    def failed(self, address: str, now: float) -> None:
        count, last = self._failures.pop(address, (0, now))
        if now - last > FAILURE_MEMORY_S:
            count = 0
        self._failures[address] = (count + 1, now)
        while len(self._failures) > ADDRESSES_MAX:
            self._failures.popitem(last=False)


FAILED_LOGINS_KEY: Final = web.AppKey("failed_logins", FailedLogins)


def credentials(header: str) -> tuple[str, str] | None:
    """(username, password) from an `Authorization: Basic` header value, or None."""
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode()
    except ValueError:  # binascii.Error, a character outside ASCII, UnicodeDecodeError
        return None
    username, colon, password = decoded.partition(":")
    return (username, password) if colon else None


def _is_loopback(address: str | None) -> bool:
    try:
        return address is not None and ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


async def authenticate(request: web.Request, *, any_user: bool = False) -> Caller:
    """The caller of `request`. Raises HttpError 401 (and waits first after repeated
    failures from the same address).

    `any_user`: a user without a management tag is let in (stream reads for the Spark
    source, which AMQP consumers of the stream may do anyway).
    """
    broker = request.app[BROKER_KEY]
    failures = request.app[FAILED_LOGINS_KEY]
    address = request.remote or "?"
    given = credentials(request.headers.get("Authorization", ""))
    user: User | None = None
    if given is not None:
        user = broker.accounts.authenticate(*given)
        if user is not None and not login_allowed(user.name, _is_loopback(request.remote)):
            user = None
    if user is None:
        now = time.monotonic()
        delay_s = failures.delay_s(address, now)
        failures.failed(address, now)
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        raise HttpError(401, "Login failed")
    if not any_user and not MANAGEMENT_TAGS.intersection(user.tags):
        raise HttpError(401, "Not management user")
    who = Caller(broker, user)
    request[CALLER_KEY] = who
    return who
