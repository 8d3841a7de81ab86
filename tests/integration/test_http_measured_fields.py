"""The management API's figures are measured, never constants: consumer activity on a
single-active-consumer queue, the uncommitted publishes and acks of a transaction, and
the node's process figures.

Method: real pika clients put the broker in a known state (two consumers on a
single-active-consumer queue, a channel in a transaction, twenty open connections, threads
busy outside the GIL) and the HTTP API must report that state, then the changed one after
the clients act again (the active consumer cancels, the transaction commits, the
connections close).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pika

from streamq.broker.resources import ResourceLimits
from tests.integration.conftest import RunningBroker
from tests.integration.mgmt_http import call, connect, mgmt_broker, q, wait_for
from tests.integration.rabbitmqadmin_runner import Admin, admin, rabbitmqadmin

__all__ = ["admin", "mgmt_broker", "rabbitmqadmin"]

SAC = {"x-single-active-consumer": True}
CONNECTIONS = 20
HASH_BYTES = 8 * 1024 * 1024  # hashlib releases the GIL for inputs this large
BUSY_THREADS = 2
TERABYTE = 1 << 40


def _statuses(consumers: object) -> dict[str, tuple[bool, str]]:
    assert isinstance(consumers, list)
    return {c["consumer_tag"]: (c["active"], c["activity_status"]) for c in consumers}


def _queue(b: RunningBroker, name: str) -> dict[str, object]:
    status, body, _ = call(b, "GET", f"/api/queues/%2F/{q(name)}")
    assert status == 200 and isinstance(body, dict)
    return body


def test_single_active_consumer_activity(mgmt_broker: RunningBroker) -> None:
    b = mgmt_broker
    with connect(b) as conn:
        first, second = conn.channel(), conn.channel()
        first.queue_declare("sac", arguments=SAC)
        first.queue_declare("plain")
        first.basic_consume("sac", lambda *a: None, consumer_tag="c1")
        second.basic_consume("sac", lambda *a: None, consumer_tag="c2")
        second.basic_consume("plain", lambda *a: None, consumer_tag="c3", exclusive=True)
        expected = {
            "c1": (True, "single_active"),
            "c2": (False, "waiting"),
            "c3": (True, "up"),
        }
        assert _statuses(call(b, "GET", "/api/consumers")[1]) == expected
        assert _statuses(call(b, "GET", "/api/consumers/%2F")[1]) == expected
        queue = _queue(b, "sac")
        assert queue["single_active_consumer_tag"] == "c1"
        assert queue["exclusive_consumer_tag"] is None
        assert _statuses(queue["consumer_details"]) == {k: expected[k] for k in ("c1", "c2")}
        plain = _queue(b, "plain")
        assert plain["single_active_consumer_tag"] is None
        assert plain["exclusive_consumer_tag"] == "c3"
        listed = {q["name"]: q for q in call(b, "GET", "/api/queues")[1]}
        assert listed["sac"]["single_active_consumer_tag"] == "c1"
        channels = call(b, "GET", "/api/channels")[1]
        assert isinstance(channels, list)
        by_channel = {c["number"]: _statuses(c["consumer_details"]) for c in channels}
        assert by_channel == {1: {"c1": expected["c1"]}, 2: {k: expected[k] for k in ("c2", "c3")}}
        # The waiting consumer gets nothing while the active one is there.
        first.basic_publish("", "sac", b"m")
        conn.process_data_events(time_limit=0.1)
        wait_for(lambda: _queue(b, "sac")["messages_unacknowledged"] == 1)
        first.basic_cancel("c1")
        wait_for(lambda: _queue(b, "sac")["single_active_consumer_tag"] == "c2")
        assert _statuses(call(b, "GET", "/api/consumers")[1]) == {
            "c2": (True, "single_active"),
            "c3": (True, "up"),
        }
        second.basic_cancel("c2")
        wait_for(lambda: _queue(b, "sac")["single_active_consumer_tag"] is None)


def _channel(b: RunningBroker, number: int) -> dict[str, object]:
    channels = call(b, "GET", "/api/channels")[1]
    assert isinstance(channels, list)
    (found,) = [c for c in channels if c["number"] == number]
    assert isinstance(found, dict)
    return found


def _uncommitted(b: RunningBroker, number: int) -> tuple[object, object]:
    found = _channel(b, number)
    return found["messages_uncommitted"], found["acks_uncommitted"]


def test_transaction_counts(mgmt_broker: RunningBroker) -> None:
    b = mgmt_broker
    with connect(b) as conn:
        plain = conn.channel()
        plain.queue_declare("txq")
        for _ in range(3):
            plain.basic_publish("", "txq", b"before")
        tx = conn.channel()
        # In this order: a basic.qos with global=false lifts the channel's global limit,
        # as RabbitMQ's does (tests/differential/scenarios/deliveries.py).
        tx.basic_qos(prefetch_count=4)
        tx.basic_qos(prefetch_count=11, global_qos=True)
        found = _channel(b, 2)
        assert (found["global_prefetch_count"], found["prefetch_count"]) == (11, 4)
        tx.basic_qos(prefetch_count=4)
        found = _channel(b, 2)
        assert (found["global_prefetch_count"], found["prefetch_count"]) == (0, 4)
        tx.tx_select()
        tags = []
        for _ in range(3):
            method, _, _ = tx.basic_get("txq")
            assert method is not None
            tags.append(method.delivery_tag)
        assert _uncommitted(b, 2) == (0, 0)
        for _ in range(3):
            tx.basic_publish("", "txq", b"in tx")
        tx.basic_ack(tags[1], multiple=True)  # two messages in one ack
        conn.process_data_events(time_limit=0.05)
        wait_for(lambda: _uncommitted(b, 2) == (3, 2))
        found = _channel(b, 2)
        assert found["transactional"] is True and found["messages_unacknowledged"] == 1
        assert _queue(b, "txq")["messages"] == 3  # nothing applied before the commit
        tx.tx_commit()
        assert _uncommitted(b, 2) == (0, 0)
        assert _queue(b, "txq")["messages"] == 4  # 3 - 2 acked + 3 published
        # A reject is held as well, but acks_uncommitted counts acks only (RabbitMQ).
        tx.basic_publish("", "txq", b"rolled back")
        tx.basic_reject(tags[2])
        conn.process_data_events(time_limit=0.05)
        wait_for(lambda: _uncommitted(b, 2) == (1, 0))
        assert _channel(b, 2)["messages_unacknowledged"] == 0
        tx.tx_rollback()
        assert _uncommitted(b, 2) == (0, 0)
        assert _channel(b, 2)["messages_unacknowledged"] == 1


def _node(b: RunningBroker) -> dict[str, object]:
    status, nodes, _ = call(b, "GET", "/api/nodes")
    assert status == 200 and isinstance(nodes, list) and len(nodes) == 1
    node = nodes[0]
    assert isinstance(node, dict)
    return node


def _open(b: RunningBroker, count: int) -> Iterator[pika.BlockingConnection]:
    for _ in range(count):
        yield connect(b)


def test_node_figures_follow_connections(mgmt_broker: RunningBroker) -> None:
    b = mgmt_broker
    before = _node(b)
    assert "proc_total" not in before  # no limit on threads and tasks to report
    assert before["processors"] == len(os.sched_getaffinity(0))
    assert before["fd_total"] == before["sockets_total"] and before["fd_total"] > 0
    assert before["sockets_used"] == 0
    threads = len(os.listdir("/proc/self/task"))
    assert before["proc_used"] >= threads
    assert before["mem_used"] > 0 and before["uptime"] > 0
    connections = list(_open(b, CONNECTIONS))
    try:
        during = _node(b)
        # Both ends of each connection live in this process: at least one descriptor each.
        assert during["fd_used"] >= before["fd_used"] + CONNECTIONS
        assert during["sockets_used"] == CONNECTIONS
    finally:
        for conn in connections:
            conn.close()
    wait_for(lambda: _node(b)["sockets_used"] == 0)
    assert _node(b)["fd_used"] < during["fd_used"]


def test_run_queue_counts_busy_threads(mgmt_broker: RunningBroker) -> None:
    """Threads hashing large buffers run outside the GIL, so they are runnable (state R)
    when the HTTP handler looks; the run queue must see them, and lose them once done."""
    b = mgmt_broker
    stop = threading.Event()
    data = bytes(HASH_BYTES)

    def busy() -> None:
        while not stop.is_set():
            hashlib.sha256(data).digest()

    workers = [threading.Thread(target=busy, daemon=True) for _ in range(BUSY_THREADS)]
    for worker in workers:
        worker.start()
    try:
        wait_for(lambda: _node(b)["run_queue"] >= 1)
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=10)
    wait_for(lambda: _node(b)["run_queue"] == 0)


def _connection_rates(b: RunningBroker) -> tuple[float, float]:
    (found,) = call(b, "GET", "/api/connections")[1]
    return found["recv_oct_details"]["rate"], found["send_oct_details"]["rate"]


def test_connection_byte_rates(mgmt_broker: RunningBroker) -> None:
    """A connection that publishes shows a receive rate (the web UI's "From client"
    column), and 0.0 again once it stops; sampled every 0.4 s for the test."""
    b = mgmt_broker
    assert b.broker is not None
    b.broker.stats_sampler.interval_s = 0.4
    with connect(b) as conn:
        channel = conn.channel()
        channel.queue_declare("rates")
        assert _connection_rates(b) == (0.0, 0.0)

        def publishing() -> bool:
            for _ in range(50):
                channel.basic_publish("", "rates", bytes(1000))
            conn.process_data_events(time_limit=0.02)
            return _connection_rates(b)[0] > 1000

        wait_for(publishing)
        wait_for(lambda: _connection_rates(b)[0] == 0.0)


def _states(b: RunningBroker) -> list[object]:
    found = call(b, "GET", "/api/connections")[1]
    assert isinstance(found, list)
    return sorted(c["state"] for c in found)


def test_connection_states_under_an_alarm(tmp_path: Path) -> None:
    """With the memory alarm on from the start (a 1-byte limit), a connection that has not
    published is `blocking`, one that published is `blocked`; both `running` once the
    alarm clears."""
    running = RunningBroker(tmp_path / "data", ResourceLimits(1, 0))
    try:
        idle = connect(running)
        publisher = connect(running)
        publisher.channel().basic_publish("", "nowhere", b"x")
        publisher.process_data_events(time_limit=0.05)
        wait_for(lambda: _states(running) == ["blocked", "blocking"])

        def clear() -> None:
            assert running.broker is not None
            running.broker.resources.limits = ResourceLimits(TERABYTE, 0)

        running.call(clear)
        wait_for(lambda: _states(running) == ["running", "running"])
        idle.close()
        publisher.close()
    finally:
        running.stop()


def test_rabbitmqadmin_reads_the_fields(admin: Admin, broker: RunningBroker) -> None:
    """RabbitMQ's own rabbitmqadmin lists the new and measured fields as columns."""
    params = pika.ConnectionParameters("127.0.0.1", broker.amqp_port)
    with pika.BlockingConnection(params) as conn:
        first, second = conn.channel(), conn.channel()
        first.queue_declare("sac", arguments=SAC)
        first.basic_consume("sac", lambda *a: None, consumer_tag="c1")
        second.basic_consume("sac", lambda *a: None, consumer_tag="c2")
        second.tx_select()
        second.basic_publish("", "sac", b"held")
        conn.process_data_events(time_limit=0.05)
        consumers = admin.tsv("list", "consumers", "consumer_tag", "active", "activity_status")
        assert sorted(consumers, key=lambda c: c["consumer_tag"]) == [
            {"consumer_tag": "c1", "active": "True", "activity_status": "single_active"},
            {"consumer_tag": "c2", "active": "False", "activity_status": "waiting"},
        ]
        queues = admin.tsv("list", "queues", "name", "single_active_consumer_tag")
        assert queues == [{"name": "sac", "single_active_consumer_tag": "c1"}]
        channels = admin.tsv("list", "channels", "number", "messages_uncommitted")
        assert sorted(c["messages_uncommitted"] for c in channels) == ["0", "1"]
        (node,) = admin.raw("list", "nodes", "name", "fd_used", "proc_used", "run_queue")
        assert set(node) == {"name", "fd_used", "proc_used", "run_queue"}
        assert node["fd_used"] > 0 and node["proc_used"] > 0
