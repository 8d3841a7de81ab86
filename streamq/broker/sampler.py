"""The sampler of message statistics: a vhost's totals and every counter's rates.

Owns the periodic sample (`Sampler.tick`, from the gateway's housekeeping) and the sums
over a vhost's queues and exchanges (`vhost_counts`). The counters themselves are
`stats.MessageStats`, which queues and vhosts hold; this module reads vhosts, so it sits
above them in the imports.
"""

from __future__ import annotations

from collections.abc import Iterable

from streamq.broker.stats import (
    FIELDS,
    STATS_INTERVAL_S,
    MessageStats,
    add_counts,
    message_stats_json,
)
from streamq.broker.vhost import VHost


def vhost_counts(vhost: VHost) -> tuple[int, ...]:
    """The vhost's totals: publishes as its exchanges received them (`publish`, with
    `publish_in`/`publish_out`), deliveries and acks as its queues counted them (the
    live ones and those deleted since it opened), confirms and unroutable publishes as
    the vhost itself counted them."""
    total = list(vhost.stats.counts())
    add_counts(total, vhost.retired_stats.counts())
    for queue in vhost.queues.values():
        add_counts(total, queue.stats.counts())
    total[0] = 0  # a queue's `publish` counts enqueues, not publishes
    for stats in vhost.exchange_stats.values():
        total[0] += stats.publish_in
        total[1] += stats.publish_in
        total[2] += stats.publish_out
    return tuple(total)


class Sampler:
    """Samples every queue, exchange and vhost each `interval_s`; `tick` is called by a
    timer more often than that (the gateway's housekeeping)."""

    def __init__(self, interval_s: float = STATS_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.last_s: float | None = None
        # The vhosts' totals at the last sample, keyed by vhost name.
        self.vhost_totals: dict[str, MessageStats] = {}

    def tick(self, vhosts: Iterable[VHost], now_s: float) -> bool:
        """Take a sample if the interval has passed; returns whether one was taken."""
        if self.last_s is not None and now_s - self.last_s < self.interval_s:
            return False
        self.last_s = now_s
        seen = set()
        for vhost in vhosts:
            seen.add(vhost.name)
            for queue in vhost.queues.values():
                queue.stats.sample(queue.stats.counts(), now_s)
            for stats in vhost.exchange_stats.values():
                stats.sample(stats.counts(), now_s)
            totals = self.vhost_totals.setdefault(vhost.name, MessageStats())
            totals.sample(vhost_counts(vhost), now_s)
        for gone in set(self.vhost_totals) - seen:
            del self.vhost_totals[gone]
        return True

    def vhost_json(self, vhost: VHost) -> dict[str, object]:
        """The vhost's `message_stats`: live totals, rates of the last sample."""
        totals = self.vhost_totals.get(vhost.name)
        rates = totals.rates if totals is not None else (0.0,) * len(FIELDS)
        return message_stats_json(vhost_counts(vhost), rates)

    def overall(self, vhosts: Iterable[VHost]) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """Totals and rates over `vhosts` (the overview's and Prometheus' globals)."""
        counts = [0] * len(FIELDS)
        rates = [0.0] * len(FIELDS)
        for vhost in vhosts:
            add_counts(counts, vhost_counts(vhost))
            totals = self.vhost_totals.get(vhost.name)
            if totals is not None:
                for index, rate in enumerate(totals.rates):
                    rates[index] += rate
        return tuple(counts), tuple(rates)
