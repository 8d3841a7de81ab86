"""AMQP over WebSocket and the `Origin` header: cross-site WebSocket hijacking
(http_gateway/websocket_api.py, docs/websocket.md "Origins"). A web page of any site,
opened in a browser on the broker's host, can open ws://127.0.0.1:<http port>/: its
connection comes from loopback, where guest/guest may log in. So a connection whose
upgrade names an Origin (browsers always send one) that is neither listed in
`websocket_allow_origins` nor the broker's own origin on a loopback host is not local: guest
is refused with 403 ACCESS_REFUSED. With a list set, an unlisted Origin is refused at the
upgrade with HTTP 403 (RabbitMQ's web_stomp.allow_origins). Real broker, aiohttp's
WebSocket client sending the headers a browser would, frames from pamqp."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from pamqp import commands

from tests.integration.conftest import RunningBroker
from tests.integration.ws_amqp import RawAmqp

APP_USER, APP_PASSWORD = "app", "app-secret"
EVIL = "http://evil.example"
LISTED = "https://app.example:8443"


def ws_url(broker: RunningBroker) -> str:
    return f"ws://127.0.0.1:{broker.http_port}/"


def own_origin(broker: RunningBroker) -> str:
    return f"http://127.0.0.1:{broker.http_port}"


def add_app_user(broker: RunningBroker) -> None:
    body = {"password": APP_PASSWORD, "tags": ""}
    assert broker.http("PUT", f"/api/users/{APP_USER}", body)[0] in (201, 204)
    grant = {"configure": ".*", "write": ".*", "read": ".*"}
    assert broker.http("PUT", f"/api/permissions/%2F/{APP_USER}", grant)[0] in (201, 204)


async def refused_login(
    broker: RunningBroker, headers: dict[str, str]
) -> commands.Connection.Close:
    """Log in as guest over a socket upgraded with `headers`; the broker's close."""
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(ws_url(broker), headers=headers) as ws,
    ):
        amqp = RawAmqp(ws)
        await amqp.log_in("guest", "guest")
        close = await amqp.expect(commands.Connection.Close)
        assert isinstance(close, commands.Connection.Close)
        return close


async def opens(broker: RunningBroker, headers: dict[str, str], user: str = "guest") -> None:
    """A connection over a socket upgraded with `headers` logs in as `user` and opens."""
    password = APP_PASSWORD if user == APP_USER else "guest"
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(ws_url(broker), headers=headers) as ws,
    ):
        amqp = RawAmqp(ws)
        await amqp.handshake(user=user, password=password)
        await amqp.send(b"")  # nothing: the handshake's open-ok is the proof


async def test_guest_from_a_cross_origin_page_is_refused(broker: RunningBroker) -> None:
    for origin in (EVIL, "null", f"http://localhost:{broker.http_port + 1}", "garbage"):
        close = await refused_login(broker, {"Origin": origin})
        assert close.reply_code == 403, origin
        assert close.reply_text.startswith("ACCESS_REFUSED - Login was refused"), origin
    # Nothing was let in; the broker still serves guest without a browser's Origin.
    conns = broker.http("GET", "/api/connections")[1]
    assert conns == []
    await opens(broker, {})


async def test_guest_from_the_brokers_own_loopback_origin_opens(broker: RunningBroker) -> None:
    await opens(broker, {"Origin": own_origin(broker)})
    await opens(broker, {"Origin": own_origin(broker).upper() + "/"})  # the same origin


async def test_a_dns_rebinding_page_is_not_local(broker: RunningBroker) -> None:
    # evil.example's name pointed at 127.0.0.1: its page is same-origin with what its
    # browser asks for (Host: evil.example:<port>), but not a page of this machine.
    rebound = f"evil.example:{broker.http_port}"
    close = await refused_login(broker, {"Host": rebound, "Origin": f"http://{rebound}"})
    assert close.reply_code == 403


async def test_other_users_log_in_from_any_origin(broker: RunningBroker) -> None:
    add_app_user(broker)  # the password is the credential, not the address
    await opens(broker, {"Origin": EVIL}, user=APP_USER)
    await opens(broker, {"Origin": "null"}, user=APP_USER)


@pytest.fixture
def listing_broker(tmp_path: Path) -> Iterator[RunningBroker]:
    running = RunningBroker(tmp_path / "data", websocket_allow_origins=f"{LISTED},{EVIL}:8080")
    yield running
    running.stop()


async def test_an_allow_list_refuses_other_origins_at_the_upgrade(
    listing_broker: RunningBroker,
) -> None:
    broker = listing_broker
    add_app_user(broker)
    async with aiohttp.ClientSession() as session:
        for origin in (EVIL, "http://evil.example:8081", own_origin(broker), "null"):
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await session.ws_connect(ws_url(broker), headers={"Origin": origin})
            assert refused.value.status == 403, origin
    # Listed (in any spelling of the same origin): served, and local for guest, as the
    # operator vouched for those pages.
    await opens(broker, {"Origin": LISTED})
    await opens(broker, {"Origin": "HTTPS://APP.EXAMPLE:8443/"})
    await opens(broker, {"Origin": f"{EVIL}:8080"}, user=APP_USER)
    # No Origin: not a browser, served as before.
    await opens(broker, {})
    assert broker.http("GET", "/api/overview")[0] == 200
