"""A follower's forwarders and the leadership hooks, on their own.

Goal: a forwarder pipes bytes both ways to its target, AMQP's with a PROXY v1 header
naming the client first; closing it closes the connections it piped; its buffering is
bounded (a target that reads nothing stops the client's sends after a bounded amount);
hooks run the operator's command with the node's id and URI, and one that hangs is
killed after its timeout. Method: real loopback sockets and real shell commands, each
test on its own asyncio loop (asyncio.run), every wait bounded.
"""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import pytest
import uvloop

from streamq.cluster.hooks import Hooks
from streamq.cluster.proxy import (
    WRITE_BUFFER_BYTES_HIGH,
    Forwarder,
    proxy_v1_header,
    split_address,
)

TIMEOUT_S = 10.0


def test_headers_and_addresses() -> None:
    assert proxy_v1_header(("127.0.0.9", 4000), ("127.0.0.1", 5672)) == (
        b"PROXY TCP4 127.0.0.9 127.0.0.1 4000 5672\r\n"
    )
    assert proxy_v1_header(("::1", 1), ("::1", 2)) == b"PROXY TCP6 ::1 ::1 1 2\r\n"
    assert proxy_v1_header(("::1", 1), ("127.0.0.1", 2)) == b"PROXY UNKNOWN\r\n"
    assert split_address("127.0.0.1:5672") == ("127.0.0.1", 5672)
    assert split_address("[::1]:15672") == ("::1", 15672)


async def _echo_server() -> tuple[asyncio.Server, list[bytes]]:
    firsts: list[bytes] = []

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = await reader.readline()
        firsts.append(first)
        writer.write(first)
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    return await asyncio.start_server(echo, "127.0.0.1", 0), firsts


@pytest.mark.parametrize("header", [True, False])
def test_bytes_go_both_ways_with_the_header_first(header: bool) -> None:
    async def main() -> None:
        server, firsts = await _echo_server()
        target = server.sockets[0].getsockname()[:2]
        forwarder = Forwarder("AMQP", target, proxy_header=header)
        port = await forwarder.start("127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        client_port = writer.get_extra_info("sockname")[1]
        writer.write(b"hello\n" + b"x" * 300_000)
        expected = (
            f"PROXY TCP4 127.0.0.1 127.0.0.1 {client_port} {port}\r\n".encode()
            if header
            else b"hello\n"
        )
        echoed = await asyncio.wait_for(
            reader.readexactly(len(expected) + (6 + 300_000 if header else 300_000)), TIMEOUT_S
        )
        assert firsts == [expected]
        assert echoed.startswith(expected)
        assert echoed.endswith(b"x" * 300_000)
        assert forwarder.connections == 1
        await forwarder.close()  # the leader went away: the client is closed
        assert await asyncio.wait_for(reader.read(), TIMEOUT_S) == b""
        writer.close()
        server.close()
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", port)  # no longer listening

    uvloop.run(asyncio.wait_for(main(), 3 * TIMEOUT_S))


def test_an_unreachable_target_closes_the_client_promptly() -> None:
    async def main() -> None:
        with socket.socket() as unused:
            unused.bind(("127.0.0.1", 0))
            target = unused.getsockname()[:2]  # bound, not listening: refused
        forwarder = Forwarder("HTTP", target, proxy_header=False)
        port = await forwarder.start("127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await asyncio.wait_for(reader.read(), TIMEOUT_S) == b""
        writer.close()
        await forwarder.close()

    uvloop.run(asyncio.wait_for(main(), 3 * TIMEOUT_S))


def test_a_target_that_does_not_read_bounds_what_the_forwarder_takes() -> None:
    """Without flow control the forwarder would read all the client sends into memory;
    with it, the client's sends stop once the kernel buffers and one write buffer of
    WRITE_BUFFER_BYTES_HIGH are full."""

    async def main() -> int:
        accepted: list[asyncio.StreamWriter] = []

        async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.append(writer)  # never reads

        server = await asyncio.start_server(hold, "127.0.0.1", 0)
        forwarder = Forwarder("AMQP", server.sockets[0].getsockname()[:2], proxy_header=False)
        port = await forwarder.start("127.0.0.1", 0)
        client = socket.create_connection(("127.0.0.1", port))
        client.setblocking(False)
        sent, chunk = 0, b"y" * 65536
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < 1.0:
            try:
                sent += client.send(chunk)
                quiet_since = time.monotonic()
            except BlockingIOError:
                await asyncio.sleep(0.05)
            assert sent < 256 << 20, "the forwarder kept reading"
        client.close()
        await forwarder.close()
        server.close()
        return sent

    sent = uvloop.run(asyncio.wait_for(main(), 60))
    # Four kernel socket buffers (a few MiB on Linux) plus the forwarder's one.
    assert sent < 64 << 20
    assert sent > WRITE_BUFFER_BYTES_HIGH


def test_hooks_run_with_the_node_id_and_uri(tmp_path: Path) -> None:
    out = tmp_path / "hook.out"

    async def main() -> None:
        hooks = Hooks("abc123", "tcp://127.0.0.1:5679")
        hooks.run("on_leader_elected", f'echo "$STREAMQ_NODE_ID $STREAMQ_LEADER_URI" > {out}')
        hooks.run("on_leader_lost", "")  # nothing configured: nothing runs
        await hooks.close()

    asyncio.run(asyncio.wait_for(main(), TIMEOUT_S))
    assert out.read_text() == "abc123 tcp://127.0.0.1:5679\n"


def test_a_hanging_hook_is_killed_after_its_timeout(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    marker = tmp_path / "late"

    async def main() -> float:
        hooks = Hooks("n1", "tcp://127.0.0.1:1", timeout_s=0.5)
        started = time.monotonic()
        hooks.run("on_leader_lost", f"sleep 30; touch {marker}")
        await hooks.close()
        return time.monotonic() - started

    took = asyncio.run(asyncio.wait_for(main(), TIMEOUT_S))
    assert took < 5
    assert "hook on_leader_lost killed after 0.5 s" in caplog.text
    time.sleep(0.2)
    assert not marker.exists()
