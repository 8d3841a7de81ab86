"""Publish-only rate over AMQP-over-WebSocket against AMQP over TCP, on one broker.

Starts `streamq serve` on loopback ports chosen by the OS with a fresh data directory (and
stops it by its pid), then for each message size and batching runs the same publisher
over both transports: pre-encoded basic.publish frames (method, header, body; encoded
once by pamqp), `--batch` publishes per socket write or WebSocket message, confirms on
(the channel in confirm mode, at most `--window` unconfirmed), to one non-durable queue
that is deleted afterwards. The rate is messages confirmed per second, from the first
write to the last confirm; the median of `--rounds` runs, transports alternating. Beside
it, the broker's CPU time per message (user + system, from /proc): what the broker spends,
less sensitive than the rate to a loaded machine and to the client's own cost.

  .venv/bin/python benchmarks/websocket.py [--messages 200000] [--sizes 16,1024]
      [--batches 1,100] [--rounds 3] [--json out.json]

A browser client (@cloudamqp/amqp-client) sends one WebSocket message per publish:
`--batches 1` is its case.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import uvloop
from pamqp import body, commands, frame, header

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import cpu_model
from tests.integration.broker_process import BrokerProcess

FRAME_METHOD = 1
BASIC_ACK = (60, 80)
CONNECT_TIMEOUT_S = 10
RUN_TIMEOUT_S = 300

Send = Callable[[bytes], Awaitable[None]]
Receive = Callable[[], Awaitable[bytes]]


def handshake_frames() -> list[bytes]:
    """What the client sends, in order, each after the broker's answer to the one before
    (the protocol header, start-ok, tune-ok + open, channel.open, confirm.select)."""
    start_ok = commands.Connection.StartOk(client_properties={}, response="\0guest\0guest")
    return [
        b"AMQP\x00\x00\x09\x01",
        frame.marshal(start_ok, 0),
        frame.marshal(commands.Connection.TuneOk(2047, 131072, 0), 0)
        + frame.marshal(commands.Connection.Open("/"), 0),
        frame.marshal(commands.Channel.Open(), 1),
        frame.marshal(commands.Confirm.Select(), 1),
    ]


def publish_frames(queue: str, size: int) -> bytes:
    return (
        frame.marshal(commands.Basic.Publish(exchange="", routing_key=queue), 1)
        + frame.marshal(header.ContentHeader(0, size, commands.Basic.Properties()), 1)
        + frame.marshal(body.ContentBody(b"x" * size), 1)
    )


class Frames:
    """Splits received bytes into method frames: (class id, method id, payload)."""

    def __init__(self) -> None:
        self.buffer = b""

    def feed(self, data: bytes) -> list[tuple[int, int, bytes]]:
        self.buffer += data
        out, position = [], 0
        while len(self.buffer) - position >= 8:
            kind, _, size = struct.unpack_from(">BHI", self.buffer, position)
            if len(self.buffer) - position < size + 8:
                break
            if kind == FRAME_METHOD:
                payload = self.buffer[position + 7 : position + 7 + size]
                class_id, method_id = struct.unpack_from(">HH", payload)
                out.append((class_id, method_id, payload))
            position += size + 8
        self.buffer = self.buffer[position:]
        return out


async def open_channel(send: Send, receive: Receive, frames: Frames) -> None:
    for step in handshake_frames():
        await send(step)
        while not frames.feed(await receive()):
            pass


async def publish_run(
    send: Send, receive: Receive, queue: str, size: int, count: int, batch: int, window: int
) -> float:
    """Publish `count` messages in writes of `batch`; seconds until the last confirm."""
    frames = Frames()
    await open_channel(send, receive, frames)
    declare = commands.Queue.Declare(queue=queue)
    await send(frame.marshal(declare, 1))
    while not frames.feed(await receive()):
        pass
    chunk = publish_frames(queue, size) * batch
    confirmed = 0
    room = asyncio.Event()
    room.set()

    async def read_confirms() -> None:
        nonlocal confirmed
        while confirmed < count:
            for class_id, method_id, payload in frames.feed(await receive()):
                if (class_id, method_id) == BASIC_ACK:
                    confirmed = max(confirmed, struct.unpack_from(">Q", payload, 4)[0])
            room.set()  # the writer looks again at its window

    started = time.perf_counter()
    reader = asyncio.ensure_future(read_confirms())
    sent = 0
    while sent < count:
        if sent - confirmed > window:
            room.clear()
            await room.wait()
            continue
        await send(chunk)
        sent += batch
    await asyncio.wait_for(reader, RUN_TIMEOUT_S)
    seconds = time.perf_counter() - started
    await send(frame.marshal(commands.Queue.Delete(queue=queue), 1))
    return seconds


async def over_tcp(port: int, *run: int) -> float:
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection("127.0.0.1", port), CONNECT_TIMEOUT_S
    )

    async def send(data: bytes) -> None:
        writer.write(data)
        await writer.drain()

    async def receive() -> bytes:
        data = await reader.read(1 << 20)
        if not data:
            raise ConnectionError("broker closed the connection")
        return data

    try:
        return await publish_run(send, receive, "bench-tcp", *run)
    finally:
        writer.close()


async def over_websocket(port: int, *run: int) -> float:
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(f"ws://127.0.0.1:{port}/", protocols=("amqp",)) as ws,
    ):

        async def receive() -> bytes:
            msg = await ws.receive()
            if msg.type is not aiohttp.WSMsgType.BINARY:
                raise ConnectionError(f"WebSocket closed: {msg.type}")
            data: bytes = msg.data
            return data

        return await publish_run(ws.send_bytes, receive, "bench-ws", *run)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(pid: int, run: Awaitable[float]) -> tuple[float, float]:
    """(seconds, broker CPU seconds) of one run."""
    before = cpu_seconds(pid)
    seconds = uvloop.run(run)
    return seconds, cpu_seconds(pid) - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--sizes", default="16,1024")
    parser.add_argument("--batches", default="1,100")
    parser.add_argument("--window", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="ws-bench-") as data_dir:
        broker = BrokerProcess(Path(data_dir) / "data")
        try:
            for size in (int(s) for s in args.sizes.split(",")):
                for batch in (int(b) for b in args.batches.split(",")):
                    run = (size, args.messages, batch, args.window)
                    pid = broker.process.pid
                    tcp, ws = [], []
                    for _ in range(args.rounds):
                        tcp.append(timed(pid, over_tcp(broker.amqp_port, *run)))
                        ws.append(timed(pid, over_websocket(broker.http_port, *run)))
                    rows.append(report(size, batch, args.messages, tcp, ws))
        finally:
            broker.stop()
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({"cpu": cpu_model(), "rows": rows}, indent=2))


def report(
    size: int, batch: int, count: int, tcp: list[tuple[float, float]], ws: list[tuple[float, float]]
) -> dict[str, float]:
    tcp_rate = count / statistics.median(t for t, _ in tcp)
    ws_rate = count / statistics.median(t for t, _ in ws)
    tcp_cpu_us = statistics.median(c for _, c in tcp) / count * 1e6
    ws_cpu_us = statistics.median(c for _, c in ws) / count * 1e6
    print(
        f"{size:>6} B  batch {batch:>4}  TCP {tcp_rate:>9,.0f} msg/s {tcp_cpu_us:5.1f} us/msg  "
        f"WebSocket {ws_rate:>9,.0f} msg/s {ws_cpu_us:5.1f} us/msg  "
        f"WebSocket/TCP rate {ws_rate / tcp_rate:.2f}",
        flush=True,
    )
    return {
        "size": size,
        "batch": batch,
        "tcp_msgs_s": tcp_rate,
        "ws_msgs_s": ws_rate,
        "tcp_broker_cpu_us_per_msg": tcp_cpu_us,
        "ws_broker_cpu_us_per_msg": ws_cpu_us,
    }


if __name__ == "__main__":
    main()
