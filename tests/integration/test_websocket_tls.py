"""AMQP over WebSocket on the HTTPS port (wss://), as LavinMQ serves it: the same upgrade
as on the HTTP port, inside TLS made with the test CA's server certificate."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from pamqp import commands

from tests.integration.conftest import RunningBroker
from tests.integration.tls_setup import Certs, client_context, pki, port_of, tls_broker
from tests.integration.ws_amqp import RawAmqp, method, publish

__all__ = ["pki"]  # a fixture, used by name


@pytest.fixture
def broker(tmp_path: Path, pki: Certs) -> Iterator[RunningBroker]:
    running = tls_broker(tmp_path, pki.server)
    yield running
    running.stop()


async def test_amqp_over_wss_publishes_with_confirms_and_gets(
    broker: RunningBroker, pki: Certs
) -> None:
    url = f"wss://127.0.0.1:{port_of(broker, 'https')}/ws"
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(
            url, protocols=("amqp",), ssl=client_context(pki.ca), server_hostname="localhost"
        ) as ws,
    ):
        assert ws.protocol == "amqp"
        amqp = RawAmqp(ws)
        await amqp.handshake()
        await amqp.send(
            method(commands.Channel.Open(), 1)
            + method(commands.Confirm.Select(), 1)
            + method(commands.Queue.Declare(queue="over-wss"), 1)
            + publish(1, "over-wss", b"through TLS")
        )
        await amqp.expect(commands.Channel.OpenOk)
        await amqp.expect(commands.Confirm.SelectOk)
        await amqp.expect(commands.Queue.DeclareOk)
        ack = await amqp.expect(commands.Basic.Ack)
        assert ack.delivery_tag == 1  # type: ignore[attr-defined]
        await amqp.send(method(commands.Basic.Get(queue="over-wss", no_ack=True), 1))
        await amqp.expect(commands.Basic.GetOk)
        await amqp.next_frame()  # the content header
        _, content = await amqp.next_frame()
        assert content.value == b"through TLS"  # type: ignore[attr-defined]
        _, listed, _ = broker.http("GET", "/api/connections")
        assert isinstance(listed, list) and len(listed) == 1
        assert listed[0]["ssl"] is True and listed[0]["port"] == port_of(broker, "https")


async def test_wss_refuses_a_client_that_does_not_trust_the_certificate(
    broker: RunningBroker, pki: Certs
) -> None:
    url = f"wss://127.0.0.1:{port_of(broker, 'https')}/"
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await session.ws_connect(
                url,
                protocols=("amqp",),
                ssl=client_context(pki.other_ca),
                server_hostname="localhost",
            )
    # The broker goes on: a trusted client still gets through.
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(
            url, protocols=("amqp",), ssl=client_context(pki.ca), server_hostname="localhost"
        ) as ws,
    ):
        await RawAmqp(ws).handshake()


async def test_wss_same_origin_is_https_with_the_https_port(
    broker: RunningBroker, pki: Certs
) -> None:
    # The broker's own origin on its HTTPS port is https://HOST:PORT: a guest login from a
    # page of it opens; the http:// origin of the same host and port is another origin.
    port = port_of(broker, "https")
    url = f"wss://127.0.0.1:{port}/"
    ssl = client_context(pki.ca)
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(
            url,
            ssl=ssl,
            server_hostname="localhost",
            headers={"Origin": f"https://127.0.0.1:{port}"},
        ) as ws:
            await RawAmqp(ws).handshake()
        for other in (f"http://127.0.0.1:{port}", f"https://127.0.0.1:{port + 1}"):
            async with session.ws_connect(
                url, ssl=ssl, server_hostname="localhost", headers={"Origin": other}
            ) as ws:
                amqp = RawAmqp(ws)
                await amqp.log_in("guest", "guest")
                close = await amqp.expect(commands.Connection.Close)
                assert close.reply_code == 403, other  # type: ignore[attr-defined]
