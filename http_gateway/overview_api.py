"""`/api/overview`, `/api/nodes`, `/api/aliveness-test/{vhost}`, as RabbitMQ has them.

Owns the broker-wide views: the overview (versions, node, listeners, object and queue
totals, message stats), the nodes (a single node: memory, file descriptors, disk and
their limits and alarms, uptime; in a cluster, `Broker.cluster`, every node with its role,
in-sync replica membership and replication lag as well) and the aliveness test (declare the
`aliveness-test` queue, publish a message to it and get it back, as RabbitMQ does). The
views count what the caller may see; nodes need `monitoring` or `administrator`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import Final

from aiohttp import web

from http_gateway.context import (
    SEES_ALL_VHOSTS_TAGS,
    Caller,
    caller,
    require_tags,
    vhost_for,
    visible_vhosts,
)
from http_gateway.errors import HttpError
from http_gateway.listing import list_response, object_response
from streamq import __version__
from streamq.broker import process_figures
from streamq.broker.broker import Broker
from streamq.broker.cluster_view import NodeRow
from streamq.broker.node_names import PRODUCT_NAME, cluster_node_name, node_name, this_node_name
from streamq.broker.resources import disk_free_bytes, process_memory_bytes
from streamq.broker.stats import message_stats_json
from streamq.broker.vhost import VHost

ALIVENESS_QUEUE: Final = "aliveness-test"
ALIVENESS_BODY: Final = b"test_message"
EMPTY_PROPERTIES: Final = b"\x00\x00"  # AMQP basic properties: no flags set
LISTEN_BACKLOG: Final = 100  # asyncio's (and uvloop's) create_server default

routes = web.RouteTableDef()


def queue_totals(vhosts: list[VHost]) -> dict[str, int]:
    ready = unacked = 0
    for vhost in vhosts:
        for queue in vhost.queues.values():
            ready += queue.message_count
            unacked += queue.cursor.unacked_count
    return {
        "messages": ready + unacked,
        "messages_ready": ready,
        "messages_unacknowledged": unacked,
    }


def object_totals(broker: Broker, vhosts: list[VHost]) -> dict[str, int]:
    names = {vhost.name for vhost in vhosts}
    clients = [c for c in broker.clients.values() if c.vhost in names]
    return {
        "connections": len(clients),
        "channels": sum(len(c.channels()) for c in clients),
        "exchanges": sum(len(v.exchanges) for v in vhosts),
        "queues": sum(len(v.queues) for v in vhosts),
        "consumers": sum(len(q.consumers) for v in vhosts for q in v.queues.values()),
    }


def message_stats(broker: Broker, vhosts: list[VHost]) -> dict[str, object]:
    """The overview's `message_stats`: counts and rates over `vhosts` (filled in by the
    message statistics, `streamq.broker.stats`)."""
    counts, rates = broker.stats_sampler.overall(vhosts)
    return message_stats_json(counts, rates)


def socket_opts(protocol: str, port: int) -> dict[str, object]:
    """A listener's `socket_opts` as RabbitMQ shows them: the TCP options of the AMQP
    listeners (asyncio's backlog, Nagle off), the port of the management ones."""
    if protocol.startswith("amqp"):
        return {"backlog": LISTEN_BACKLOG, "nodelay": True}
    return {"port": port}


def listeners(broker: Broker, request: web.Request) -> list[dict[str, object]]:
    """Every listener of the broker (as the process registered them: "amqp", "amqp/ssl",
    "http", "https", RabbitMQ's protocol names), or at least the one serving `request`."""
    found = [(p, ip, port) for p, ip, port in broker.listeners]
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    if sockname and not any(p.startswith("http") for p, _, _ in found):
        found.append(("http", sockname[0], sockname[1]))
    return [
        {
            "node": this_node_name(broker),
            "protocol": p,
            "ip_address": ip,
            "port": port,
            "socket_opts": socket_opts(p, port),
        }
        for p, ip, port in found
    ]


def overview(who: Caller, request: web.Request) -> dict[str, object]:
    """RabbitMQ's overview, counting what `who` may see."""
    broker = who.broker
    vhosts = visible_vhosts(who)
    return {
        "management_version": __version__,
        "rabbitmq_version": __version__,
        "product_name": PRODUCT_NAME,
        "product_version": __version__,
        "cluster_name": node_name(),
        "node": this_node_name(broker),
        "rates_mode": "basic",
        "exchange_types": [
            {"name": kind, "enabled": True}
            for kind in ("direct", "fanout", "headers", "topic", "x-consistent-hash")
        ],
        "listeners": listeners(broker, request),
        "object_totals": object_totals(broker, vhosts),
        "queue_totals": queue_totals(vhosts),
        "message_stats": message_stats(broker, vhosts),
    }


@routes.get("/api/overview")
async def get_overview(request: web.Request) -> web.Response:
    return object_response(request, overview(caller(request), request))


def process_fields(broker: Broker) -> dict[str, object]:
    """The process's figures, each measured now (`streamq.broker.process_figures`); a
    figure that cannot be measured here is left out, not shown as 0. RabbitMQ's Erlang
    processes are streamq's threads and asyncio tasks, with no limit to report (no
    `proc_total`); its run queue is the threads ready to run."""
    fd_limit = process_figures.fd_total()
    found: dict[str, object | None] = {
        "fd_used": process_figures.fd_used(),
        "fd_total": fd_limit,
        # Client connections over a socket (the broker's own links are "direct"); the
        # file descriptor limit is the only bound on them.
        "sockets_used": sum(
            1 for c in broker.clients.values() if getattr(c, "connection_type", "") != "direct"
        ),
        "sockets_total": fd_limit,
        "proc_used": process_figures.thread_count() + len(asyncio.all_tasks()),
        "run_queue": process_figures.runnable_threads(),
        "processors": process_figures.processors(),
    }
    return {name: value for name, value in found.items() if value is not None}


def node(broker: Broker) -> dict[str, object]:
    """RabbitMQ's node object for this process (`/api/nodes/{name}`)."""
    limits = broker.resources.limits
    alarm = broker.resources.check(log_out_of_space=bool(broker.syncer.out_of_space))
    out: dict[str, object] = {
        "name": this_node_name(broker),
        "type": "disc",
        "running": True,
        "os_pid": str(os.getpid()),
        "mem_limit": limits.memory_high_watermark_bytes,
        "mem_alarm": "memory" in alarm,
        "mem_calculation_strategy": "rss",
    }
    memory = process_memory_bytes()  # 0: no /proc to read it from
    if memory:
        out["mem_used"] = memory
    with contextlib.suppress(OSError):  # unreadable: left out rather than shown as 0
        out["disk_free"] = disk_free_bytes(broker.data_dir)
    out.update(
        disk_free_limit=limits.disk_free_limit_bytes,
        disk_free_alarm="disk" in alarm,
        **process_fields(broker),
        uptime=int((time.monotonic() - broker.started_s) * 1000),
        rates_mode="basic",
        db_dir=os.path.abspath(broker.data_dir),
        partitions=[],
    )
    return out


def cluster_fields(row: NodeRow) -> dict[str, object]:
    """What a cluster adds to a node object (LavinMQ's followers list, RabbitMQ's names)."""
    return {
        "node_id": row.node_id,
        "cluster_role": row.cluster_role,
        "in_isr": row.in_isr,
        "state": row.state,
        "replication_lag_bytes": row.replication_lag_bytes,
        "replication_lag_seconds": round(row.replication_lag_seconds, 3),
        "advertised_uri": row.advertised_uri,
        "amqp_address": row.amqp,
        "http_address": row.http,
    }


def all_nodes(broker: Broker) -> list[dict[str, object]]:
    """This node, then (in a cluster) every other node: the others' process figures are
    theirs to tell, so they get the cluster fields and `running` only."""
    if broker.cluster is None:
        return [node(broker)]
    found: list[dict[str, object]] = []
    for row in broker.cluster.nodes():
        if row.is_self:
            found.insert(0, node(broker) | cluster_fields(row))
        else:
            base = {"name": cluster_node_name(row.node_id), "type": "disc"}
            found.append(base | {"running": row.connected} | cluster_fields(row))
    return found


@routes.get("/api/nodes")
async def list_nodes(request: web.Request) -> web.Response:
    who = caller(request)
    require_tags(who, SEES_ALL_VHOSTS_TAGS)
    return list_response(request, all_nodes(who.broker), pageable=False)


@routes.get("/api/nodes/{name}")
async def get_node(request: web.Request) -> web.Response:
    who = caller(request)
    require_tags(who, SEES_ALL_VHOSTS_TAGS)
    for found in all_nodes(who.broker):
        if found["name"] == request.match_info["name"]:
            return web.json_response(found)
    raise HttpError(404, "Not Found")


@routes.get("/api/aliveness-test/{vhost}")
async def aliveness_test(request: web.Request) -> web.Response:
    """Declare `aliveness-test`, publish a message to it, get it back (RabbitMQ's test)."""
    vhost = vhost_for(caller(request), request.match_info["vhost"])
    queue = vhost.declare_queue(ALIVENESS_QUEUE, False, False, False, False, {}, None)
    vhost.purge_queue(ALIVENESS_QUEUE, None)
    vhost.publish("", ALIVENESS_QUEUE, EMPTY_PROPERTIES, ALIVENESS_BODY, [queue])
    taken = vhost.get(queue, int(time.time() * 1000))
    if taken is None:
        return web.json_response({"status": "failed", "reason": "no message"}, status=503)
    ready, record = taken
    body = record.body
    vhost.settle(queue, ready.offset)
    if body != ALIVENESS_BODY:
        return web.json_response({"status": "failed", "reason": "wrong message"}, status=503)
    return web.json_response({"status": "ok"})
