"""compare.py's TLS lines: each broker's TLS rate as a share of its TCP rate."""

from __future__ import annotations

from benchmarks.compare_report import Row, tls_lines
from benchmarks.scenarios import CONSUME, PUBLISH


def test_tls_share_of_tcp_per_broker_and_metric() -> None:
    rows = [
        Row("publish only, 16 B", "", PUBLISH, values_a=[100.0, 200.0, 300.0], values_b=[50.0]),
        Row("TLS: publish only, 16 B", "", PUBLISH, values_a=[150.0], values_b=[40.0]),
        Row("1 pub + 1 cons, manual ack", "", CONSUME, values_a=[10.0], values_b=[10.0]),
        Row("TLS: 1 pub + 1 cons, manual ack", "", CONSUME, values_a=[9.0], errors_b=["x"]),
    ]
    assert tls_lines(rows, ["streamq", "RabbitMQ"]) == [
        "TLS: publish only, 16 B, publish: TLS/TCP streamq 75%, RabbitMQ 80%",
        "TLS: 1 pub + 1 cons, manual ack, consume: TLS/TCP streamq 90%, RabbitMQ n/a",
    ]


def test_no_line_without_the_tcp_twin() -> None:
    rows = [Row("TLS: publish only, 1 KiB", "", PUBLISH, values_a=[1.0], values_b=[1.0])]
    assert tls_lines(rows, ["A", "B"]) == []
