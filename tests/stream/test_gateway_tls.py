"""The stream protocol over TLS (`streams_port`): rstream publishes with confirms and reads
back, and a client certificate logs in with SASL EXTERNAL, as over AMQPS."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from rstream import (
    AMQPMessage,
    Consumer,
    ConsumerOffsetSpecification,
    OffsetType,
    Producer,
    amqp_decoder,
)

from stream_gateway.codec import commands as c
from stream_gateway.codec import decode, encode, split_frames
from stream_gateway.codec.constants import ResponseCode
from tests.integration.conftest import RunningBroker
from tests.integration.tls_setup import Certs, client_context, handshake, pki, port_of

__all__ = ["pki"]  # a fixture, used by name
TIMEOUT_S = 10


@pytest.fixture
def broker(tmp_path: Path, pki: Certs) -> Iterator[RunningBroker]:
    running = RunningBroker(
        tmp_path / "data",
        streams_port=0,
        tls_cert=str(pki.server.cert),
        tls_key=str(pki.server.key),
        tls_verify_peer=True,
        tls_ca_cert=str(pki.ca.cert),
    )
    try:
        yield running
    finally:
        running.stop()


async def test_rstream_over_tls(broker: RunningBroker, pki: Certs) -> None:
    port = port_of(broker, "stream/ssl")
    context = client_context(pki.ca, pki.client_guest)
    login = {"username": "guest", "password": "guest", "ssl_context": context}
    async with Producer("localhost", port, **login) as producer:  # type: ignore[arg-type]
        await producer.create_stream("secure")
        await producer.send_batch("secure", [AMQPMessage(body=b"%d" % i) for i in range(20)])
    received: list[bytes] = []
    done = asyncio.Event()

    async def on_message(message: AMQPMessage, _context: object) -> None:
        received.append(bytes(message.body))
        if len(received) == 20:
            done.set()

    async with Consumer("localhost", port, **login) as consumer:  # type: ignore[arg-type]
        spec = ConsumerOffsetSpecification(OffsetType.FIRST)
        await consumer.subscribe(
            "secure", on_message, decoder=amqp_decoder, offset_specification=spec
        )
        await asyncio.wait_for(done.wait(), TIMEOUT_S)
    assert received == [b"%d" % i for i in range(20)]


def test_a_client_certificate_logs_in_with_external(broker: RunningBroker, pki: Certs) -> None:
    port = port_of(broker, "stream/ssl")
    sock = handshake(port, client_context(pki.ca, pki.client_guest))
    buffer = bytearray()

    def request(command: c.Command) -> c.Command:
        sock.sendall(encode(command))
        while True:
            frames, used = split_frames(buffer, 1 << 20)
            if frames:
                del buffer[:used]
                return decode(frames[0])
            buffer.extend(sock.recv(65536))

    try:
        request(c.PeerProperties(1, {}))
        mechanisms = request(c.SaslHandshake(2))
        assert isinstance(mechanisms, c.SaslHandshakeResponse)
        assert "EXTERNAL" in mechanisms.mechanisms
        assert request(c.SaslAuthenticate(3, "EXTERNAL", b"")) == c.SaslAuthenticateResponse(
            3, ResponseCode.OK
        )
    finally:
        sock.close()
