"""The request/reply rows of `benchmarks/compare.py` (issue 30, item 6): many small
publishes, each answered.

Owns an RPC server and an RPC client, both on the perf tool's AMQP client (pre-encoded
frames, one socket write per batch of replies or requests), since `streamq perf` has no
request/reply mode. The server (`python benchmarks/request_reply.py serve URL QUEUE`, a
subprocess of its own, stopped by its pid) consumes the request queue with manual acks
and answers each request with a publish to its `reply_to`, carrying its
`correlation_id`, and a `basic.ack` of its own. The client keeps a window of requests
outstanding and sends a new one for each reply, over a reply queue of its own (exclusive,
server-named) or over direct reply-to (`amq.rabbitmq.reply-to`); it counts round trips for
the run's duration and checks that every reply answers a request it sent. Each run uses
names of its own and deletes them afterwards; failures raise `ScenarioError`.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from amqp_gateway import codec
from amqp_gateway.codec import methods as m
from benchmarks.compare_report import Metric
from benchmarks.perf_process import ScenarioError
from benchmarks.scenarios import Run, Runner, Scenario, clean_up
from streamq.perf.client import AmqpClient
from streamq.perf.errors import PerfError
from streamq.perf.uri import parse_uri
from streamq.perf.wire import CHANNEL, body_bytes

DIRECT_REPLY_TO: Final = "amq.rabbitmq.reply-to"
BODY_BYTES: Final = 16
SERVER_PREFETCH: Final = 1000
"""The server's basic.qos: above every window below, so the window alone sets the pace."""
WINDOW_WIDE: Final = 100
WINDOW_ONE: Final = 1
SERVER_READY_TIMEOUT_S: Final = 30.0
SERVER_STOP_TIMEOUT_S: Final = 10.0
REPLY_TIMEOUT_S: Final = 10.0
"""The longest a client waits for any reply before the run counts as failed."""
_REPO: Final = Path(__file__).resolve().parents[1]

ROUND_TRIPS: Final = Metric("round_trip_rate", "round trips", "/s", higher_is_better=True)


@dataclass(slots=True)
class Content:
    """The delivery being assembled from its method, header and body frames."""

    properties: codec.BasicProperties | None = None
    delivery_tag: int = 0
    body_left: int = 0
    complete: list[tuple[int, codec.BasicProperties]] = field(default_factory=list)

    def take(self, frames: list[codec.Frame], client: AmqpClient) -> None:
        """Add `frames`; each finished delivery goes to `complete` as (tag, properties)."""
        for frame in frames:
            if frame.frame_type == codec.FRAME_METHOD:
                method = client.method_of(frame)
                if isinstance(method, m.BasicDeliver):
                    self.delivery_tag = method.delivery_tag
            elif frame.frame_type == codec.FRAME_HEADER:
                header = codec.decode_content_header(frame.payload)
                self.properties = codec.decode_properties(header.properties_raw)
                self.body_left = header.body_size
                if self.body_left == 0:
                    self._finish()
            elif frame.frame_type == codec.FRAME_BODY:
                self.body_left -= len(frame.payload)
                if self.body_left <= 0:
                    self._finish()

    def _finish(self) -> None:
        assert self.properties is not None, "a body before its header"
        self.complete.append((self.delivery_tag, self.properties))
        self.properties = None


def append_publish(
    out: bytearray, routing_key: str, properties: codec.BasicProperties, frame_max: int
) -> None:
    publish = m.BasicPublish(exchange="", routing_key=routing_key)
    raw = codec.encode_properties(properties)
    codec.append_content_frames(out, CHANNEL, publish, raw, body_bytes(BODY_BYTES), frame_max)


def serve(url: str, queue: str) -> None:
    """Answer every request on `queue` until the connection closes or SIGTERM."""
    client = AmqpClient.connect(parse_uri(url))
    client.call(m.BasicQos(prefetch_count=SERVER_PREFETCH), m.BasicQosOk)
    client.call(m.BasicConsume(queue=queue, consumer_tag="rpc-server"), m.BasicConsumeOk)
    print("ready", flush=True)
    content = Content()
    frames = client.leftover_frames()
    while True:
        content.take(frames, client)
        out = bytearray()
        for tag, properties in content.complete:
            if properties.reply_to:
                reply = codec.BasicProperties(correlation_id=properties.correlation_id)
                append_publish(out, properties.reply_to, reply, client.frame_max)
            out += codec.encode_method_frame(CHANNEL, m.BasicAck(delivery_tag=tag))
        content.complete.clear()
        if out:
            client.send(out)
        frames = client.take_frames(time.monotonic() + 3600.0, "requests")


class Server:
    """The RPC server subprocess on `queue`, in a session of its own."""

    def __init__(self, url: str, queue: str) -> None:
        command = [sys.executable, str(Path(__file__).resolve()), "serve", url, queue]
        env = {**os.environ, "PYTHONPATH": str(_REPO)}
        self.process = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None
        os.set_blocking(self.process.stdout.fileno(), True)
        deadline = time.monotonic() + SERVER_READY_TIMEOUT_S
        line = ""
        while time.monotonic() < deadline and self.process.poll() is None:
            line = self.process.stdout.readline()  # "ready", or EOF when it fails
            if line:
                break
        if line.strip() != "ready":
            self.stop()
            raise ScenarioError(f"RPC server did not start: {self.error_text()}")

    def error_text(self) -> str:
        if self.process.poll() is None or self.process.stderr is None:
            return "still starting"
        return self.process.stderr.read()[-500:].strip()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(SERVER_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(SERVER_STOP_TIMEOUT_S)


def call_for(url: str, queue: str, direct: bool, window: int, duration_s: float) -> float:
    """Round trips per second for `duration_s`, with `window` requests outstanding.
    Raises `ScenarioError`."""
    try:
        client = AmqpClient.connect(parse_uri(url))
    except (PerfError, ValueError) as exc:
        raise ScenarioError(f"RPC client: {exc}") from None
    try:
        return _call_loop(client, queue, direct, window, duration_s)
    except PerfError as exc:
        raise ScenarioError(f"RPC client: {exc}") from None
    finally:
        client.close()


def _call_loop(
    client: AmqpClient, queue: str, direct: bool, window: int, duration_s: float
) -> float:
    reply_to = DIRECT_REPLY_TO
    if not direct:
        reply_to = client.call(m.QueueDeclare(queue="", exclusive=True), m.QueueDeclareOk).queue
    client.call(m.BasicConsume(queue=reply_to, no_ack=True), m.BasicConsumeOk)
    outstanding: set[str] = set()
    sent = done = 0
    out = bytearray()
    for _ in range(window):
        sent = _request(out, queue, reply_to, sent, outstanding, client.frame_max)
    client.send(out)
    content = Content()
    frames = client.leftover_frames()
    started = time.monotonic()
    stop = started + duration_s
    while (now := time.monotonic()) < stop:
        content.take(frames, client)
        out = bytearray()
        for _tag, properties in content.complete:
            answered = properties.correlation_id or ""
            if answered not in outstanding:
                raise ScenarioError(f"a reply to {answered!r}, which is not outstanding")
            outstanding.discard(answered)
            done += 1
            sent = _request(out, queue, reply_to, sent, outstanding, client.frame_max)
        content.complete.clear()
        if out:
            client.send(out)
        frames = client.take_frames(now + REPLY_TIMEOUT_S, "replies")
    return done / (time.monotonic() - started)


def _request(
    out: bytearray, queue: str, reply_to: str, sent: int, outstanding: set[str], frame_max: int
) -> int:
    correlation_id = str(sent)
    outstanding.add(correlation_id)
    properties = codec.BasicProperties(reply_to=reply_to, correlation_id=correlation_id)
    append_publish(out, queue, properties, frame_max)
    return sent + 1


def _declare(url: str, queue: str) -> None:
    try:
        client = AmqpClient.connect(parse_uri(url))
    except (PerfError, ValueError) as exc:
        raise ScenarioError(f"declare {queue}: {exc}") from None
    try:
        client.call(m.QueueDeclare(queue=queue), m.QueueDeclareOk)
    except PerfError as exc:
        raise ScenarioError(f"declare {queue}: {exc}") from None
    finally:
        client.close()


def round_trips(direct: bool, window: int) -> Runner:
    """A runner: the server on a request queue of the run's own, the client for the
    run's duration."""

    def run_rpc(run: Run) -> dict[str, float]:
        queue = run.name()
        try:
            _declare(run.broker.url, queue)
            server = Server(run.broker.url, queue)
            try:
                rate = call_for(run.broker.url, queue, direct, window, run.settings.duration_s)
            finally:
                server.stop()
        finally:
            clean_up(run, [queue])
        return {"round_trip_rate": rate}

    return run_rpc


def request_reply_scenarios() -> list[Scenario]:
    """The request/reply rows, beside the batch rows of the perf issue's matrix."""
    shapes = (
        ("rpc-queue", "reply queue", False, WINDOW_WIDE),
        ("rpc-direct", "direct reply-to", True, WINDOW_WIDE),
        ("rpc-direct-1", "direct reply-to", True, WINDOW_ONE),
    )
    return [
        Scenario(
            key,
            f"request/reply, {how}, {window} outstanding",
            f"{BODY_BYTES} B requests and replies, server acks each request, {window} in flight",
            (ROUND_TRIPS,),
            round_trips(direct, window),
        )
        for key, how, direct, window in shapes
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    server = commands.add_parser("serve", help="the RPC server (a subprocess of the runs)")
    server.add_argument("url")
    server.add_argument("queue")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        serve(args.url, args.queue)
    except PerfError as exc:
        print(f"RPC server: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
