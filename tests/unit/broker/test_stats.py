"""Message stats: counters, rates per sample interval, RabbitMQ's JSON shape, and vhost
totals that keep the counts of deleted queues."""

from __future__ import annotations

from pathlib import Path

from streamq.broker.sampler import Sampler, vhost_counts
from streamq.broker.stats import FIELDS, MessageStats, message_stats_json
from streamq.broker.vhost import VHost
from streamq.log.syncer import ROUND_SECONDS_BUCKETS, Histogram, Syncer


def test_rates_are_per_second_since_the_previous_sample() -> None:
    stats = MessageStats()
    stats.publish = 10
    stats.sample(stats.counts(), 100.0)
    assert stats.to_json() == {"publish": 10, "publish_details": {"rate": 0.0}}
    stats.publish += 50
    stats.deliver = 20
    stats.get_no_ack = 5
    stats.sample(stats.counts(), 105.0)
    got = stats.to_json()
    assert got["publish"] == 60 and got["publish_details"] == {"rate": 10.0}
    assert got["deliver_details"] == {"rate": 4.0}
    assert got["deliver_get"] == 25 and got["deliver_get_details"] == {"rate": 5.0}
    assert "ack" not in got  # only counters seen so far, as RabbitMQ
    stats.sample(stats.counts(), 110.0)
    assert stats.to_json()["publish_details"] == {"rate": 0.0}


def test_add_and_json_of_counts() -> None:
    stats = MessageStats()
    stats.add(tuple(range(len(FIELDS))))
    assert stats.counts() == tuple(range(len(FIELDS)))
    assert message_stats_json((0,) * len(FIELDS), (0.0,) * len(FIELDS)) == {}


def test_vhost_totals_keep_deleted_queues(tmp_path: Path) -> None:
    syncer = Syncer()
    vhost = VHost("/", str(tmp_path / "v"), syncer)
    try:
        queue = vhost.declare_queue("q", False, False, False, False, {}, None)
        vhost.exchange_stats[""] = MessageStats()
        vhost.exchange_stats[""].publish_in = 3
        vhost.exchange_stats[""].publish_out = 2
        queue.stats.publish = 2
        queue.stats.ack = 2
        vhost.stats.confirm = 3
        totals = dict(zip(FIELDS, vhost_counts(vhost), strict=True))
        assert totals["publish"] == 3 and totals["publish_in"] == 3
        assert totals["publish_out"] == 2 and totals["ack"] == 2 and totals["confirm"] == 3
        vhost.delete_queue("q", False, False, None)
        assert vhost_counts(vhost) == tuple(totals.values())
        sampler = Sampler(interval_s=5.0)
        assert sampler.tick([vhost], 0.0)
        assert not sampler.tick([vhost], 4.0)
        vhost.stats.confirm += 10
        assert sampler.tick([vhost], 5.0)
        assert sampler.vhost_json(vhost)["confirm_details"] == {"rate": 2.0}
        counts, rates = sampler.overall([vhost])
        assert counts[FIELDS.index("confirm")] == 13 and rates[FIELDS.index("confirm")] == 2.0
    finally:
        vhost.close()
        syncer.close()


def test_fsync_histogram() -> None:
    histogram = Histogram(ROUND_SECONDS_BUCKETS)
    histogram.observe(0.00005)
    histogram.observe(0.003)
    histogram.observe(100.0)
    assert histogram.counts[0] == 1 and histogram.counts[5] == 1 and histogram.counts[-1] == 1
    assert histogram.count == 3
    syncer = Syncer()
    try:
        assert syncer.submit(lambda: 7).result(timeout=5) == 7
        assert syncer.round_seconds.count == 1
    finally:
        syncer.close()
