"""A declare that finds its queue or exchange in place answers at once, even while the
vhost has changes waiting for a sync round; one that creates a durable entity still waits
for the round (docs/durability.md).

kombu redeclares Celery's `rpc://` reply queue (auto-delete, so never cached) before every
task it sends: when every such Declare-Ok waited for the fsync of other queues' publishes
and acks, a Celery caller sent about 100 tasks a second (issue 30). The Syncer's one
thread is held busy here, so no round can finish until the test lets it."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pika
from pika.adapters.blocking_connection import BlockingChannel

from tests.integration.conftest import RunningBroker

TIMEOUT_S = 10.0
SETTLE_S = 0.5  # how long a reply that must wait for the round is given to come early


def hold_syncer(broker: RunningBroker) -> threading.Event:
    """Keep the Syncer's one thread busy until the returned event is set: no sync round
    completes meanwhile."""
    release, started = threading.Event(), threading.Event()

    def hold() -> None:
        started.set()
        release.wait(TIMEOUT_S * 3)

    assert broker.broker is not None
    broker.broker.syncer.submit_write(hold)
    assert started.wait(TIMEOUT_S), "the Syncer never ran the hold"
    return release


def in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    out: list[object] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def unsynced_publish(channel: BlockingChannel, queue: str) -> None:
    """A persistent publish to a durable queue: its journal entry waits for a round."""
    channel.basic_publish("", queue, b"m", pika.BasicProperties(delivery_mode=2))


def test_redeclares_answer_while_a_round_is_pending(
    broker: RunningBroker, channel: BlockingChannel
) -> None:
    channel.queue_declare("tasks", durable=True)
    channel.queue_declare("replies", auto_delete=True)
    channel.exchange_declare("work", "direct", durable=True)
    release = hold_syncer(broker)
    try:
        unsynced_publish(channel, "tasks")

        def redeclare() -> object:
            channel.queue_declare("replies", auto_delete=True)
            channel.queue_declare("tasks", durable=True)
            channel.queue_declare("tasks", passive=True)
            channel.exchange_declare("work", "direct", durable=True)
            return "answered"

        thread, out = in_thread(redeclare)
        thread.join(TIMEOUT_S)
        assert out == ["answered"], "a redeclare waited for the held sync round"
    finally:
        release.set()
    # And the message published meanwhile is there, once the round ran.
    assert channel.queue_declare("tasks", passive=True).method.message_count == 1


def test_a_new_durable_queue_still_waits_for_the_round(
    broker: RunningBroker, channel: BlockingChannel
) -> None:
    release = hold_syncer(broker)
    try:
        thread, out = in_thread(lambda: channel.queue_declare("fresh", durable=True))
        thread.join(SETTLE_S)
        assert out == [], "the Declare-Ok of a new durable queue came before its round"
    finally:
        release.set()
    thread.join(TIMEOUT_S)
    assert len(out) == 1 and not isinstance(out[0], BaseException), out
