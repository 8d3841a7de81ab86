"""`GET /metrics` on a real broker: Prometheus' text format without authentication,
RabbitMQ's metric names, counters that move when pika publishes, consumes and acks, and
the fsync histogram; `/metrics/detailed` per queue."""

from __future__ import annotations

import http.client

from tests.integration.conftest import RunningBroker
from tests.integration.mgmt_http import TIMEOUT_S, connect, mgmt_broker

__all__ = ["mgmt_broker"]


def scrape(broker: RunningBroker, path: str = "/metrics") -> tuple[dict[str, float], str]:
    """The samples by name (with labels), after checking every line's syntax."""
    conn = http.client.HTTPConnection("127.0.0.1", broker.http_port, timeout=TIMEOUT_S)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        text = response.read().decode()
    finally:
        conn.close()
    assert response.status == 200
    assert response.getheader("Content-Type") == "text/plain; version=0.0.4; charset=utf-8"
    samples: dict[str, float] = {}
    types: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            types[name] = kind
        elif line.startswith("# HELP "):
            continue
        else:
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
            base = name.split("{")[0]
            family = base.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count")
            assert base in types or family in types, line
    return samples, text


def test_metrics_follow_the_broker(mgmt_broker: RunningBroker) -> None:
    b = mgmt_broker
    samples, _ = scrape(b)
    assert samples["rabbitmq_connections"] == 0 and samples["rabbitmq_queues"] == 0
    assert samples["rabbitmq_global_messages_received_total"] == 0
    assert samples["rabbitmq_process_resident_memory_bytes"] > 0
    assert samples["rabbitmq_disk_space_available_bytes"] > 0
    with connect(b) as conn:
        channel = conn.channel()
        channel.confirm_delivery()
        channel.queue_declare("m")
        for _ in range(10):
            channel.basic_publish("", "m", b"x")
        channel.basic_publish("", "nowhere", b"x")
        for _ in range(3):
            method, _, _ = channel.basic_get("m")
            channel.basic_ack(method.delivery_tag)
        channel.basic_get("m")  # left unacked
        conn.process_data_events(time_limit=0.05)
        samples, _ = scrape(b)
        assert samples["rabbitmq_connections"] == 1 and samples["rabbitmq_channels"] == 1
        assert samples["rabbitmq_queues"] == 1
        assert samples["rabbitmq_queue_messages_ready"] == 6
        assert samples["rabbitmq_queue_messages_unacked"] == 1
        assert samples["rabbitmq_queue_messages"] == 7
        assert samples["rabbitmq_global_messages_received_total"] == 11
        assert samples["rabbitmq_global_messages_routed_total"] == 10
        assert samples["rabbitmq_global_messages_unroutable_dropped_total"] == 1
        assert samples["rabbitmq_global_messages_delivered_total"] == 4
        assert samples["rabbitmq_global_messages_delivered_get_manual_ack_total"] == 4
        assert samples["rabbitmq_global_messages_acknowledged_total"] == 3
        assert samples["rabbitmq_global_messages_confirmed_total"] == 11
        # Every confirm waited for an fsync round: the histogram counted them.
        count = samples["streamq_fsync_seconds_count"]
        assert count >= 1 and samples['streamq_fsync_seconds_bucket{le="+Inf"}'] == count
        assert samples["streamq_fsync_seconds_sum"] > 0
        detailed, _ = scrape(b, "/metrics/detailed?family=queue_coarse_metrics&vhost=%2F")
        assert detailed['rabbitmq_detailed_queue_messages_ready{vhost="/",queue="m"}'] == 6
        assert detailed['rabbitmq_detailed_queue_messages_unacked{vhost="/",queue="m"}'] == 1
    # A deleted queue's counts stay in the totals (counters never go back).
    with connect(b) as conn:
        conn.channel().queue_delete("m")
    samples, _ = scrape(b)
    assert samples["rabbitmq_global_messages_acknowledged_total"] == 3
    assert samples["rabbitmq_connections"] == 0 or samples["rabbitmq_connections"] == 1


def test_detailed_without_a_family_is_empty(mgmt_broker: RunningBroker) -> None:
    samples, text = scrape(mgmt_broker, "/metrics/detailed")
    assert samples == {} and text.strip() == ""
