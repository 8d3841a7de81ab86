"""The queue-feature scenarios of `benchmarks/compare.py` (issue 7): a priority queue
filled with ten priorities then drained, and dead-lettering throughput by message TTL.

Owns two runners and the one load they need that `streamq perf` lacks: publishes whose
`priority` property cycles through 0..9. That publisher speaks AMQP itself with the perf
tool's client (pre-encoded frames, one `sendall` per window of `CONFIRM_WINDOW`
publishes, confirms awaited per window), so neither broker is measured against a slow
client. Each run uses names of its own and deletes them afterwards; failures raise
`ScenarioError`. It never starts or stops a broker.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import tempfile
import time
from typing import Final

from amqp_gateway import codec
from amqp_gateway.codec import methods as m
from amqp_gateway.deaths import AmqpPropertiesCodec
from benchmarks.admin import queue_depth, wait_for_depth
from benchmarks.compare_report import Metric
from benchmarks.perf_process import ScenarioError
from benchmarks.scenarios import (
    CONSUME,
    FILL_RATE_MIN,
    PUBLISH,
    THROUGHPUT_MARGIN_S,
    Run,
    Scenario,
    clean_up,
    throughput,
)
from streamq.broker.vhost import VHost
from streamq.log.syncer import Syncer
from streamq.perf.client import AmqpClient
from streamq.perf.errors import PerfError
from streamq.perf.uri import parse_uri
from streamq.perf.wire import CHANNEL, ConfirmTracker, body_bytes

PRIORITY_MESSAGES: Final = 200_000
DEAD_LETTER_MESSAGES: Final = 200_000
PRIORITIES: Final = 10  # x-max-priority 9: priorities 0..9, one message of each in turn
CONFIRM_WINDOW: Final = 5_000  # publishes per window; a multiple of PRIORITIES
BODY_BYTES: Final = 16
DEPTH_POLL_S: Final = 0.02
_PRIORITY_ARGS: Final = {"x-max-priority": PRIORITIES - 1}

FILL: Final = Metric("fill_rate", "fill, confirmed", "msgs/s", higher_is_better=True)
DEAD_LETTER: Final = Metric("dead_letter_rate", "dead-lettered", "msgs/s", higher_is_better=True)


def publish_priorities(url: str, queue: str, count: int, timeout_s: float) -> float:
    """Declare `queue` (durable, x-max-priority 9) and publish `count` 16-byte messages
    to it with priorities 0..9 in turn, under confirms; returns the confirmed rate.
    Raises `ScenarioError`."""
    deadline = time.monotonic() + timeout_s
    try:
        client = AmqpClient.connect(parse_uri(url))
    except (PerfError, ValueError) as exc:
        raise ScenarioError(f"priority publisher: {exc}") from None
    try:
        client.call(
            m.QueueDeclare(queue=queue, durable=True, arguments=dict(_PRIORITY_ARGS)),
            m.QueueDeclareOk,
        )
        client.call(m.ConfirmSelect(), m.ConfirmSelectOk)
        window = _window(queue, client.frame_max)
        confirms = ConfirmTracker()
        started = time.monotonic()
        sent = 0
        while sent < count:
            client.send(window)
            sent += CONFIRM_WINDOW
            while confirms.settled() < sent:
                confirms.take_frames(client.take_frames(deadline, "confirms"))
        elapsed_s = time.monotonic() - started
        if confirms.nacked:
            raise ScenarioError(f"{confirms.nacked} publishes nacked")
    except PerfError as exc:
        raise ScenarioError(f"priority publisher: {exc}") from None
    finally:
        client.close()
    return sent / max(elapsed_s, 1e-9)


def _window(queue: str, frame_max: int) -> bytes:
    """CONFIRM_WINDOW publishes to `queue`, priorities 0..9 in turn, encoded once."""
    block = bytearray()
    body = body_bytes(BODY_BYTES)
    publish = m.BasicPublish(exchange="", routing_key=queue)
    for priority in range(PRIORITIES):
        properties = codec.encode_properties(codec.BasicProperties(priority=priority))
        codec.append_content_frames(block, CHANNEL, publish, properties, body, frame_max)
    return bytes(block) * (CONFIRM_WINDOW // PRIORITIES)


def priority_queue(run: Run) -> dict[str, float]:
    """Fill a priority queue with ten priorities (confirmed rate), then time one no-ack
    consumer taking every message (perf's consume-only run on the same queue)."""
    queue, count = run.name(), PRIORITY_MESSAGES
    timeout_s = count / FILL_RATE_MIN + THROUGHPUT_MARGIN_S
    try:
        fill_rate = publish_priorities(run.broker.url, queue, count, timeout_s)
        wait_for_depth(run.broker.url, queue, count, timeout_s)
        flags = ["-x", "0", "-y", "1", "-D", str(count), "--queue-args", json.dumps(_PRIORITY_ARGS)]
        consumed = throughput(run, queue, flags, timeout_s)
    finally:
        clean_up(run, [queue])
    return {"fill_rate": fill_rate, "consume_rate": consumed["consume_rate"]}


def dead_lettering(run: Run) -> dict[str, float]:
    """Publish `DEAD_LETTER_MESSAGES` to a queue with x-message-ttl 0 and no consumer,
    whose dead letters go through the default exchange to a second queue; the rate is
    the count over the time from the first publish until the second queue holds all."""
    source, dead, count = run.name(), run.name("-dead"), DEAD_LETTER_MESSAGES
    timeout_s = count / FILL_RATE_MIN + THROUGHPUT_MARGIN_S
    arguments = {
        "x-message-ttl": 0,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": dead,
    }
    flags = ["-x", "1", "-y", "0", "-s", str(BODY_BYTES), "-C", str(count)]
    flags += ["--queue-args", json.dumps(arguments)]
    try:
        _declare(run.broker.url, dead)
        published = throughput(run, source, flags, timeout_s)
        publish_s = count / max(published["publish_rate"], 1e-9)  # perf's own elapsed
        finished = time.monotonic()
        deadline = finished + timeout_s
        while (depth := queue_depth(run.broker.url, dead)) < count:
            if time.monotonic() > deadline:
                raise ScenarioError(
                    f"{dead} held {depth:,} of {count:,} dead letters after {timeout_s:.0f} s"
                )
            time.sleep(DEPTH_POLL_S)
        lag_s = time.monotonic() - finished
    finally:
        clean_up(run, [source, dead])
    # The publishing time as perf measured it (without its process start-up), plus the
    # time the last dead letters took to arrive after the last publish.
    return {
        "publish_rate": published["publish_rate"],
        "dead_letter_rate": count / (publish_s + lag_s),
    }


def _declare(url: str, queue: str) -> None:
    try:
        client = AmqpClient.connect(parse_uri(url))
    except (PerfError, ValueError) as exc:
        raise ScenarioError(f"declare {queue}: {exc}") from None
    try:
        client.call(m.QueueDeclare(queue=queue, durable=True), m.QueueDeclareOk)
    except PerfError as exc:
        raise ScenarioError(f"declare {queue}: {exc}") from None
    finally:
        client.close()


def queue_feature_scenarios() -> list[Scenario]:
    """The issue 7 scenarios, appended to the perf issue's matrix."""
    return [
        Scenario(
            "priority",
            f"priority queue, {PRIORITY_MESSAGES:,} messages, priorities 0-9",
            f"x-max-priority 9: fill under confirms, then -x 0 -y 1 -D {PRIORITY_MESSAGES}",
            (FILL, CONSUME),
            priority_queue,
        ),
        Scenario(
            "dead-letter",
            f"dead-lettering by TTL, {DEAD_LETTER_MESSAGES:,} messages",
            f"-x 1 -y 0 -C {DEAD_LETTER_MESSAGES}, x-message-ttl 0, DLX to a second queue",
            (PUBLISH, DEAD_LETTER),
            dead_lettering,
        ),
    ]


def profile_dead_lettering(
    messages: int, distinct: bool, top: int, at_least_once: bool = False
) -> float:
    """Dead letters per second of `VHost.expire_heads` in process (no sockets): `messages`
    16-byte messages expire at once from a queue with `x-message-ttl` 0 whose dead letters
    go through the default exchange to a second queue. The first pass runs under cProfile
    (its `top` functions by own time are printed), the second is timed alone and returned.
    With `distinct`, every message has its own `message_id` and a few headers, so no two
    in a row share the x-death splice. With `at_least_once`, the source is a quorum queue
    that dead-letters at least once: the time covers the expiry passes, the sync round
    that makes the copies durable and the tick that releases them."""

    def properties(n: int) -> bytes:
        if not distinct:
            return codec.encode_properties(codec.BasicProperties(delivery_mode=1))
        headers: codec.FieldTable = {"a": 1, "trace": {"id": "abc"}}
        return codec.encode_properties(
            codec.BasicProperties(message_id=str(n), delivery_mode=2, headers=headers)
        )

    with tempfile.TemporaryDirectory() as directory:
        vhost = VHost("/", directory, Syncer())
        vhost.properties_codec = AmqpPropertiesCodec()
        vhost.declare_queue("dead", False, True, False, False, {}, None)
        arguments: dict[str, object] = {
            "x-message-ttl": 0,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "dead",
        }
        if at_least_once:
            arguments.update(
                {
                    "x-queue-type": "quorum",
                    "x-dead-letter-strategy": "at-least-once",
                    "x-overflow": "reject-publish",
                }
            )
        source = vhost.declare_queue("source", False, True, False, False, arguments, None)
        now_ms = int(time.time() * 1000)
        rate = 0.0
        for profiled in (True, False):
            for n in range(messages):
                vhost.publish("", "source", properties(n), b"0123456789abcdef", [source], now_ms)
            profile = cProfile.Profile()
            started = time.perf_counter()
            if profiled:
                profile.enable()
            expired = vhost.expire_heads(now_ms + 1)
            while at_least_once and source.cursor.message_count:
                expired += vhost.expire_heads(now_ms + 1)  # bounded passes
            if at_least_once:
                vhost.log.sync_blocking()
                vhost.dead_letters.tick(now_ms + 1)
                assert not source.cursor.dead, "every dead letter released"
            profile.disable()
            rate = expired / (time.perf_counter() - started)
            if profiled:
                pstats.Stats(profile).sort_stats("tottime").print_stats(top)
        vhost.close()
    return rate


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="profile dead-lettering in process")
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--distinct", action="store_true", help="no two messages alike")
    parser.add_argument("--top", type=int, default=20, help="functions to print")
    parser.add_argument(
        "--at-least-once", action="store_true", help="a quorum queue's at-least-once dead letters"
    )
    args = parser.parse_args()
    rate = profile_dead_lettering(args.messages, args.distinct, args.top, args.at_least_once)
    print(f"without the profiler: {rate:,.0f} dead letters/s")
