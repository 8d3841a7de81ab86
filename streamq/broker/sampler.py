"""The sampler of message statistics: a vhost's totals and every counter's rates.

Owns the periodic sample (`Sampler.tick`, from the gateway's housekeeping) and the sums
over a vhost's queues and exchanges (`vhost_counts`), and the byte rates of each client
connection (`octet_rates`: RabbitMQ's `recv_oct_details` and `send_oct_details`, from
the connections' own byte counts at each sample). The counters themselves are
`stats.MessageStats`, which queues and vhosts hold; this module reads vhosts, so it sits
above them in the imports.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from streamq.broker.clients import Client
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

    def __init__(
        self, interval_s: float = STATS_INTERVAL_S, clients: Mapping[str, Client] | None = None
    ) -> None:
        self.interval_s = interval_s
        self.last_s: float | None = None
        # The vhosts' totals at the last sample, keyed by vhost name.
        self.vhost_totals: dict[str, MessageStats] = {}
        self.clients: Mapping[str, Client] = clients if clients is not None else {}
        # Per connection name: (recv_oct, send_oct) at the last sample, and the rates in
        # bytes per second between the last two samples.
        self._octets: dict[str, tuple[int, int]] = {}
        self._octet_rates: dict[str, tuple[float, float]] = {}

    def tick(self, vhosts: Iterable[VHost], now_s: float) -> bool:
        """Take a sample if the interval has passed; returns whether one was taken."""
        previous_s = self.last_s
        if previous_s is not None and now_s - previous_s < self.interval_s:
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
        self._sample_octets(now_s - previous_s if previous_s is not None else None)
        return True

    def _sample_octets(self, elapsed_s: float | None) -> None:
        octets: dict[str, tuple[int, int]] = {}
        rates: dict[str, tuple[float, float]] = {}
        for name, client in self.clients.items():
            now = octets[name] = (client.recv_oct, client.send_oct)
            before = self._octets.get(name)
            if before is not None and elapsed_s:
                rates[name] = ((now[0] - before[0]) / elapsed_s, (now[1] - before[1]) / elapsed_s)
        self._octets, self._octet_rates = octets, rates

    def octet_rates(self, name: str) -> tuple[float, float]:
        """Bytes per second received from and sent to connection `name` between the last
        two samples (0.0 until it has been sampled twice)."""
        return self._octet_rates.get(name, (0.0, 0.0))

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
