"""`GET /metrics` and `/metrics/detailed`: Prometheus' text format (version 0.0.4).

Owns the metrics endpoint, without authentication as RabbitMQ's Prometheus plugin:
object counts (`rabbitmq_connections`, `rabbitmq_queues`, ...), queue depths summed over
every queue, global message counters (`rabbitmq_global_messages_*_total`, from the message
stats), process memory, free disk and the limits of both alarms, and the histogram of
fsync round durations (`streamq_fsync_seconds`), records lost to damage on disk per vhost
(`streamq_damaged_records_total{vhost}`), and per shovel and federation link its
state (`streamq_shovel_state{vhost,name,state}`: 1 for the state it is in, 0 for the
others) and messages moved (`streamq_shovel_transferred_total`; `streamq_federation_link_*`
alike), and on a cluster leader the in-sync replica set's size
(`streamq_cluster_isr_size`), the connected followers (`streamq_cluster_followers`) and
each follower's replication lag (`streamq_cluster_follower_lag_bytes{node=...}`,
`streamq_cluster_follower_lag_seconds{node=...}`). `/metrics/detailed?family=
queue_coarse_metrics[&vhost=...]` gives per-queue depths, labelled by vhost and queue.
Memory and disk are read in a worker thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Final

from aiohttp import web

from http_gateway.context import BROKER_KEY
from streamq.broker.broker import Broker
from streamq.broker.link_definitions import SHOVEL as SHOVEL_COMPONENT
from streamq.broker.links import FEDERATION, SHOVEL, STATES
from streamq.broker.resources import disk_free_bytes, process_memory_bytes
from streamq.broker.stats import FIELDS
from streamq.broker.vhost import VHost

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"

# RabbitMQ's global counters and the message_stats fields they sum.
GLOBAL_COUNTERS: Final = (
    ("rabbitmq_global_messages_received_total", ("publish",), "Messages received from publishers"),
    (
        "rabbitmq_global_messages_routed_total",
        ("publish_out",),
        "Messages routed to at least one queue",
    ),
    (
        "rabbitmq_global_messages_delivered_total",
        ("deliver", "deliver_no_ack", "get", "get_no_ack"),
        "Messages delivered to consumers and basic.get",
    ),
    (
        "rabbitmq_global_messages_delivered_consume_manual_ack_total",
        ("deliver",),
        "Messages delivered to consumers that ack",
    ),
    (
        "rabbitmq_global_messages_delivered_consume_auto_ack_total",
        ("deliver_no_ack",),
        "Messages delivered to consumers without acks",
    ),
    (
        "rabbitmq_global_messages_delivered_get_manual_ack_total",
        ("get",),
        "Messages fetched with basic.get to be acked",
    ),
    (
        "rabbitmq_global_messages_delivered_get_auto_ack_total",
        ("get_no_ack",),
        "Messages fetched with basic.get without acks",
    ),
    ("rabbitmq_global_messages_redelivered_total", ("redeliver",), "Messages requeued"),
    ("rabbitmq_global_messages_acknowledged_total", ("ack",), "Messages acknowledged"),
    ("rabbitmq_global_messages_confirmed_total", ("confirm",), "Publishes confirmed"),
    (
        "rabbitmq_global_messages_unroutable_dropped_total",
        ("drop_unroutable",),
        "Unroutable publishes dropped",
    ),
    (
        "rabbitmq_global_messages_unroutable_returned_total",
        ("return_unroutable",),
        "Unroutable mandatory publishes returned",
    ),
)

routes = web.RouteTableDef()


def _metric(out: list[str], name: str, kind: str, help_text: str, value: float) -> None:
    out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {_number(value)}"]


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _depths(vhosts: Iterable[VHost]) -> tuple[int, int, int]:
    """Queues, ready and unacked messages over `vhosts`."""
    queues = ready = unacked = 0
    for vhost in vhosts:
        for queue in vhost.queues.values():
            queues += 1
            if queue.stream is not None:
                ready += queue.stream.message_count
            else:
                ready += queue.cursor.message_count
                unacked += queue.cursor.unacked_count
    return queues, ready, unacked


def _objects(out: list[str], broker: Broker) -> None:
    clients = list(broker.clients.values())
    channel_counts = [len(c.channels()) for c in clients]
    vhosts = list(broker.vhosts.values())
    consumers = sum(len(q.consumers) for v in vhosts for q in v.queues.values())
    queues, ready, unacked = _depths(vhosts)
    _metric(out, "rabbitmq_connections", "gauge", "Connections currently open", len(clients))
    _metric(out, "rabbitmq_channels", "gauge", "Channels currently open", sum(channel_counts))
    _metric(out, "rabbitmq_consumers", "gauge", "Consumers currently connected", consumers)
    _metric(out, "rabbitmq_queues", "gauge", "Queues available", queues)
    _metric(out, "rabbitmq_vhosts", "gauge", "Virtual hosts", len(vhosts))
    _metric(out, "rabbitmq_queue_messages_ready", "gauge", "Messages ready", ready)
    _metric(out, "rabbitmq_queue_messages_unacked", "gauge", "Messages unacked", unacked)
    _metric(out, "rabbitmq_queue_messages", "gauge", "Messages ready and unacked", ready + unacked)


def _counters(out: list[str], broker: Broker) -> None:
    counts, _ = broker.stats_sampler.overall(broker.vhosts.values())
    by_field = dict(zip(FIELDS, counts, strict=True))
    for name, fields, help_text in GLOBAL_COUNTERS:
        _metric(out, name, "counter", help_text, sum(by_field[f] for f in fields))


def _fsync(out: list[str], broker: Broker) -> None:
    histogram = broker.syncer.round_seconds
    name = "streamq_fsync_seconds"
    out += [
        f"# HELP {name} Duration of fsync rounds (group commits)",
        f"# TYPE {name} histogram",
    ]
    counts = list(histogram.counts)  # one copy: the fsync thread may be adding
    cumulative = 0
    for bound, count in zip(histogram.bounds, counts, strict=False):
        cumulative += count
        out.append(f'{name}_bucket{{le="{bound}"}} {cumulative}')
    total = sum(counts)
    out += [
        f'{name}_bucket{{le="+Inf"}} {total}',
        f"{name}_sum {histogram.sum_s!r}",
        f"{name}_count {total}",
    ]


def _process(out: list[str], broker: Broker, memory: int | None, disk: int | None) -> None:
    """Memory and free disk with their limits; a reading that failed (None) is left out
    rather than reported as 0."""
    limits = broker.resources.limits
    if memory is not None:
        _metric(out, "rabbitmq_process_resident_memory_bytes", "gauge", "Resident memory", memory)
    _metric(
        out,
        "rabbitmq_resident_memory_limit_bytes",
        "gauge",
        "Memory high watermark",
        limits.memory_high_watermark_bytes,
    )
    if disk is not None:
        _metric(out, "rabbitmq_disk_space_available_bytes", "gauge", "Free disk space", disk)
    _metric(
        out,
        "rabbitmq_disk_space_available_limit_bytes",
        "gauge",
        "Free disk space limit",
        limits.disk_free_limit_bytes,
    )


def _memory_and_disk(data_dir: str) -> tuple[int | None, int | None]:
    try:
        disk: int | None = disk_free_bytes(data_dir)
    except OSError:
        disk = None
    return process_memory_bytes() or None, disk  # 0: no /proc to read the RSS from


def _text(lines: list[str]) -> web.Response:
    return web.Response(
        body="".join(line + "\n" for line in lines).encode(),
        content_type=None,
        headers={"Content-Type": CONTENT_TYPE},
    )


def _link_rows(broker: Broker, kind: str) -> list[tuple[str, str, str, int]]:
    """(vhost, name, state, transferred) of each link of `kind`; a shovel parameter the
    runtime has not registered is "starting", as /api/shovels shows it."""
    rows = {
        (vhost, name): (link.state, link.transferred)
        for (link_kind, vhost, name), link in broker.links.items()
        if link_kind == kind
    }
    if kind == SHOVEL:
        for vhost in broker.vhosts.values():
            for parameter in vhost.parameters.list(SHOVEL_COMPONENT):
                rows.setdefault((vhost.name, parameter.name), ("starting", 0))
    return [(v, n, state, moved) for (v, n), (state, moved) in sorted(rows.items())]


def _links(out: list[str], broker: Broker) -> None:
    for kind, prefix, what in (
        (SHOVEL, "streamq_shovel", "Shovel"),
        (FEDERATION, "streamq_federation_link", "Federation link"),
    ):
        rows = _link_rows(broker, kind)
        out += [f"# HELP {prefix}_state {what} state (1 for the state it is in)"]
        out += [f"# TYPE {prefix}_state gauge"]
        for vhost, name, state, _ in rows:
            labels = f'vhost="{_label(vhost)}",name="{_label(name)}"'
            for known in sorted({*STATES, state}):
                value = 1 if known == state else 0
                out.append(f'{prefix}_state{{{labels},state="{_label(known)}"}} {value}')
        out += [f"# HELP {prefix}_transferred_total Messages the {what.lower()} moved"]
        out += [f"# TYPE {prefix}_transferred_total counter"]
        for vhost, name, _, moved in rows:
            labels = f'vhost="{_label(vhost)}",name="{_label(name)}"'
            out.append(f"{prefix}_transferred_total{{{labels}}} {moved}")


def _damage(out: list[str], broker: Broker) -> None:
    """Records found damaged on disk (bit rot) and lost, per vhost: in its message log
    and its streams' logs, since the broker started (docs/durability.md, "Bit rot")."""
    name = "streamq_damaged_records_total"
    out += [f"# HELP {name} Records lost to damage on disk", f"# TYPE {name} counter"]
    for vhost in sorted(broker.vhosts.values(), key=lambda v: v.name):
        streams = (q.stream.log.damage.records for q in vhost.queues.values() if q.stream)
        total = vhost.log.damage.records + sum(streams)
        out.append(f'{name}{{vhost="{_label(vhost.name)}"}} {total}')


def _cluster(out: list[str], broker: Broker) -> None:
    view = broker.cluster
    if view is None:
        return
    followers = [row for row in view.nodes() if not row.is_self]
    connected = [row for row in followers if row.connected]
    _metric(out, "streamq_cluster_isr_size", "gauge", "In-sync replicas, leader included",
            view.isr_size)  # fmt: skip
    _metric(out, "streamq_cluster_followers", "gauge", "Followers connected", len(connected))
    for name, help_text, field in (
        ("streamq_cluster_follower_lag_bytes", "Replication stream bytes not yet acked",
         "replication_lag_bytes"),
        ("streamq_cluster_follower_lag_seconds", "Age of the oldest unacked byte",
         "replication_lag_seconds"),
    ):  # fmt: skip
        out += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        for row in connected:
            value = _number(getattr(row, field))
            out.append(f'{name}{{node="{_label(row.node_id)}"}} {value}')


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    broker = request.app[BROKER_KEY]
    memory, disk = await asyncio.to_thread(_memory_and_disk, broker.data_dir)
    out: list[str] = []
    _objects(out, broker)
    _counters(out, broker)
    _process(out, broker, memory, disk)
    _fsync(out, broker)
    _links(out, broker)
    _damage(out, broker)
    _cluster(out, broker)
    return _text(out)


DETAILED: Final = (
    ("rabbitmq_detailed_queue_messages_ready", "Messages ready to be delivered"),
    ("rabbitmq_detailed_queue_messages_unacked", "Messages delivered but not yet acked"),
    ("rabbitmq_detailed_queue_messages", "Messages ready and unacked"),
    ("rabbitmq_detailed_queue_consumers", "Consumers on a queue"),
)


@routes.get("/metrics/detailed")
async def detailed(request: web.Request) -> web.Response:
    """RabbitMQ's `queue_coarse_metrics` family (other families are not served)."""
    broker = request.app[BROKER_KEY]
    families = request.query.getall("family", [])
    wanted = set(request.query.getall("vhost", [])) or set(broker.vhosts)
    out: list[str] = []
    if "queue_coarse_metrics" not in families:
        return _text(out)
    rows: list[list[str]] = [[] for _ in DETAILED]
    for name in sorted(wanted & set(broker.vhosts)):
        for queue in broker.vhosts[name].queues.values():
            labels = f'{{vhost="{_label(name)}",queue="{_label(queue.name)}"}}'
            if queue.stream is not None:
                ready, unacked = queue.stream.message_count, 0
            else:
                ready, unacked = queue.cursor.message_count, queue.cursor.unacked_count
            for row, value in zip(
                rows, (ready, unacked, ready + unacked, len(queue.consumers)), strict=True
            ):
                row.append(f"{labels} {value}")
    for (metric, help_text), row in zip(DETAILED, rows, strict=True):
        out += [f"# HELP {metric} {help_text}", f"# TYPE {metric} gauge"]
        out += [metric + line for line in row]
    return _text(out)
