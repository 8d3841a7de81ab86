"""Message statistics: cheap counters on the hot path, rates from a periodic sample.

Owns `MessageStats`, the counters one queue, exchange or vhost keeps (RabbitMQ's
`message_stats` fields: publish, deliver, ack, ...), and the sampler that turns counts
into rates every `STATS_INTERVAL_S` (RabbitMQ's `collect_statistics_interval`; the
sampler of a broker's vhosts is `sampler.py`, which imports the vhost: this module is
imported by it and by queues, and imports neither). Counting
is a plain integer increment of a slot (or one addition per batch) on the object the hot
path already holds: no call, dict or allocation per message. It does not know the
protocol; the gateways count what they see (publishes, confirms, returns), the vhost what
it does (deliveries, acks, redeliveries).

Exchanges' counters live in the vhost's `exchange_stats` (by name; kept when an exchange
is deleted), queues' on the queue; a deleted queue's counts move to the vhost's
`retired_stats`, so a vhost's totals never go backwards (Prometheus counters).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

STATS_INTERVAL_S: Final = 5.0  # RabbitMQ's collect_statistics_interval (5000 ms)

# RabbitMQ's message_stats counters, in the order of `MessageStats.counts()`.
FIELDS: Final = (
    "publish",
    "publish_in",
    "publish_out",
    "deliver",
    "deliver_no_ack",
    "get",
    "get_no_ack",
    "ack",
    "redeliver",
    "confirm",
    "return_unroutable",
    "drop_unroutable",
)
# deliver_get is derived: every delivery, by consumer or basic.get, acked or not.
DELIVER_GET_FIELDS: Final = ("deliver", "deliver_no_ack", "get", "get_no_ack")


class MessageStats:
    """Counters of one queue, exchange or vhost, and the rates of the last sample."""

    __slots__ = (*FIELDS, "rates", "sampled", "sampled_at_s")

    def __init__(self) -> None:
        self.publish = 0  # queue: messages enqueued; vhost: publishes received
        self.publish_in = 0  # exchange: publishes received
        self.publish_out = 0  # exchange: publishes routed to at least one queue
        self.deliver = 0  # to consumers that ack
        self.deliver_no_ack = 0
        self.get = 0  # basic.get that must be acked
        self.get_no_ack = 0
        self.ack = 0
        self.redeliver = 0  # messages requeued, hence delivered again with redelivered
        self.confirm = 0
        self.return_unroutable = 0
        self.drop_unroutable = 0
        self.sampled: tuple[int, ...] = (0,) * len(FIELDS)
        self.sampled_at_s: float | None = None
        self.rates: tuple[float, ...] = (0.0,) * len(FIELDS)

    def counts(self) -> tuple[int, ...]:
        return tuple(getattr(self, field) for field in FIELDS)

    def add(self, counts: Iterable[int]) -> None:
        """Add `counts` (in FIELDS order) to these counters."""
        for field, count in zip(FIELDS, counts, strict=True):
            setattr(self, field, getattr(self, field) + count)

    def sample(self, counts: tuple[int, ...], now_s: float) -> None:
        """Rates per second since the previous sample, from `counts` (FIELDS order)."""
        previous_s = self.sampled_at_s
        if previous_s is not None and now_s > previous_s:
            elapsed_s = now_s - previous_s
            self.rates = tuple(
                max(0, new - old) / elapsed_s for new, old in zip(counts, self.sampled, strict=True)
            )
        self.sampled = counts
        self.sampled_at_s = now_s

    def to_json(self, counts: tuple[int, ...] | None = None) -> dict[str, object]:
        """RabbitMQ's `message_stats`: each counter seen so far with `<name>_details`
        holding its rate; `counts` defaults to the live counters."""
        return message_stats_json(self.counts() if counts is None else counts, self.rates)


def message_stats_json(counts: tuple[int, ...], rates: tuple[float, ...]) -> dict[str, object]:
    out: dict[str, object] = {}
    deliver_get = 0
    deliver_get_rate = 0.0
    for field, count, rate in zip(FIELDS, counts, rates, strict=True):
        if field in DELIVER_GET_FIELDS:
            deliver_get += count
            deliver_get_rate += rate
        if count:
            out[field] = count
            out[field + "_details"] = {"rate": round(rate, 1)}
    if deliver_get:
        out["deliver_get"] = deliver_get
        out["deliver_get_details"] = {"rate": round(deliver_get_rate, 1)}
    return out


def add_counts(total: list[int], counts: tuple[int, ...]) -> None:
    for index, count in enumerate(counts):
        total[index] += count
