"""`streamq perf throughput --expiration MS`: every published message carries that
`expiration` property (the per-message TTL row of benchmarks/work_queues.py), as a real
perf process against a real broker shows; a negative value is refused."""

from __future__ import annotations

import pika

from tests.integration.conftest import RunningBroker
from tests.integration.test_perf import assert_one_line_error, perf, summary, uri


def test_published_messages_carry_the_expiration(broker: RunningBroker) -> None:
    result = perf(
        "throughput", "--uri", uri(broker.amqp_port), "-x", "1", "-y", "0", "-C", "20",
        "--expiration", "60000", "-j", "-u", "perf-expiring",
    )  # fmt: skip
    assert summary(result)["published"] == 20
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.amqp_port))
    channel = connection.channel()
    expirations = []
    while True:
        method, properties, _ = channel.basic_get("perf-expiring", auto_ack=True)
        if method is None:
            break
        expirations.append(properties.expiration)
    connection.close()
    assert expirations == ["60000"] * 20


def test_a_negative_expiration_is_refused() -> None:
    assert_one_line_error(perf("throughput", "--expiration", "-1"), "must not be negative")
