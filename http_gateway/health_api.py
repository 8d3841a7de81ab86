"""`/api/health/checks/...`: RabbitMQ 3.10's health checks, for load balancers and probes.

Owns the eight checks of RabbitMQ's management plugin (rabbit_mgmt_wm_health_check_*):
alarms and local-alarms (the memory and disk alarms, `streamq.broker.resources`),
port-listener and protocol-listener (the listeners the serving process recorded in
`Broker.listeners`), virtual-hosts (a vhost that could not be opened is down),
node-is-quorum-critical and node-is-mirror-sync-critical (a cluster leader with no other
in-sync replica to take over)
and certificate-expiration (each TLS listener's certificate and CA files). Each answers
200 `{"status": "ok", ...}` or 503 `{"status": "failed", "reason": ..., ...}` with the
fields RabbitMQ adds, and 400 for a path argument RabbitMQ refuses. A check reads the
state as it is at the request; it changes nothing. Any management user may ask, as in
RabbitMQ (the auth middleware has checked the tag).

On a cluster follower these paths are answered by the leader, to which a follower's HTTP
port forwards every request (docs/operations.md, health checks).
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Final

from aiohttp import web

from http_gateway.context import caller
from http_gateway.errors import HttpError
from http_gateway.views import queue_type_of
from streamq.broker.broker import Broker
from streamq.broker.node_names import this_node_name
from streamq.cert_validity import CertificateUnreadable, Validity, read_pem

routes = web.RouteTableDef()

FAILED_STATUS: Final = 503  # RabbitMQ's ?HEALTH_CHECK_FAILURE_STATUS
DAY_S: Final = 86400
# RabbitMQ's units (a month is a twelfth of a 365-day year, a float there too).
UNIT_S: Final[dict[str, float]] = {
    "days": DAY_S,
    "weeks": DAY_S * 7,
    "months": DAY_S * (365 / 12),
    "years": DAY_S * 365,
}
INTEGER: Final = re.compile(r"[+-]?[0-9]+")  # what Erlang's binary_to_integer accepts
TLS_PROTOCOLS: Final = frozenset({"amqp/ssl", "https", "stream/ssl"})
# rabbit_mgmt_wm_health_check_protocol_listener:normalize_protocol/1, whole: names of
# protocols streamq does not serve map too, so that they fail as they would in RabbitMQ.
PROTOCOL_ALIASES: Final = {
    **dict.fromkeys(
        ("amqp091", "amqp0.9.1", "amqp0-9-1", "amqp0_9_1", "amqp10", "amqp1.0", "amqp1-0",
         "amqp1_0"), "amqp"),
    "amqps": "amqp/ssl",
    **dict.fromkeys(("mqtt3.1", "mqtt3.1.1", "mqtt31", "mqtt311", "mqtt3_1", "mqtt3_1_1"),
                    "mqtt"),
    **dict.fromkeys(("mqtts", "mqtt+tls", "mqtt+ssl"), "mqtt/ssl"),
    **dict.fromkeys(
        ("stomp1.0", "stomp1.1", "stomp1.2", "stomp10", "stomp11", "stomp12", "stomp1_0",
         "stomp1_1", "stomp1_2"), "stomp"),
    **dict.fromkeys(("stomps", "stomp+tls", "stomp+ssl"), "stomp/ssl"),
    "https": "https",
    **dict.fromkeys(("http1", "http1.1", "http_api", "management", "management_ui", "ui"),
                    "http"),
    **dict.fromkeys(("cli", "distribution"), "clustering"),
    **dict.fromkeys(("webmqtt", "web-mqtt", "web_mqtt"), "http/web-mqtt"),
    **dict.fromkeys(
        (f"{web}{sep}{tls}" for web in ("webmqtt", "web-mqtt")
         for sep, tls in (("/", "tls"), ("/", "ssl"), ("+", "tls"), ("+", "ssl"))),
        "https/web-mqtt"),
    **dict.fromkeys(("webstomp", "web-stomp", "web_stomp"), "http/web-stomp"),
    **dict.fromkeys(
        (f"{web}{sep}{tls}" for web in ("webstomp", "web-stomp")
         for sep, tls in (("/", "tls"), ("/", "ssl"), ("+", "tls"), ("+", "ssl"))),
        "https/web-stomp"),
}  # fmt: skip


def ok(**fields: object) -> web.Response:
    return web.json_response({"status": "ok", **fields})


def failed(reason: str, **fields: object) -> web.Response:
    return web.json_response({"status": "failed", "reason": reason, **fields}, status=FAILED_STATUS)


def alarms(broker: Broker) -> list[dict[str, str]]:
    """The alarms in effect, as rabbit_alarm:format_as_maps/1 shows them."""
    reason = broker.resources.check(log_out_of_space=bool(broker.syncer.out_of_space))
    node = this_node_name(broker)
    found = []
    if "disk" in reason:
        found.append({"resource": "disk space", "node": node})
    if "memory" in reason:
        found.append({"resource": "memory", "node": node})
    return found


@routes.get("/api/health/checks/alarms")
async def check_alarms(request: web.Request) -> web.Response:
    # A leader knows its own alarms only: a follower publishes nothing, so it has none
    # that could block the cluster's publishers.
    found = alarms(caller(request).broker)
    if found:
        return failed("There are alarms in effect in the cluster", alarms=found)
    return ok()


@routes.get("/api/health/checks/local-alarms")
async def check_local_alarms(request: web.Request) -> web.Response:
    found = alarms(caller(request).broker)
    if found:
        return failed("There are alarms in effect on the node", alarms=found)
    return ok()


def network_listeners(broker: Broker) -> list[tuple[str, str, int]]:
    """The listeners with a port (a unix socket's has none)."""
    return [(p, host, port) for p, host, port in broker.listeners if port > 0]


@routes.get("/api/health/checks/port-listener/{port}")
async def check_port_listener(request: web.Request) -> web.Response:
    text = request.match_info["port"]
    if INTEGER.fullmatch(text) is None:
        raise HttpError(400, "Invalid port")
    port = int(text)
    ports = [p for _, _, p in network_listeners(caller(request).broker)]
    if port not in ports:
        return failed("No active listener", missing=port, ports=ports)
    return ok(port=port)


@routes.get("/api/health/checks/protocol-listener/{protocol}")
async def check_protocol_listener(request: web.Request) -> web.Response:
    asked = request.match_info["protocol"].lower()
    protocol = PROTOCOL_ALIASES.get(asked, asked)
    protocols = [p for p, _, _ in caller(request).broker.listeners]
    if protocol not in protocols:
        return failed("No active listener", missing=protocol, protocols=protocols)
    return ok(protocol=protocol)


@routes.get("/api/health/checks/virtual-hosts")
async def check_virtual_hosts(request: web.Request) -> web.Response:
    down = sorted(caller(request).broker.failed_vhosts)
    if down:
        return failed("Some virtual hosts are down", **{"virtual-hosts": down})
    return ok()


def critical_queues(broker: Broker) -> list[dict[str, str]]:
    """The queues no node could serve if this one stopped: every queue kept across a
    restart, when this node leads and no other node is in sync and connected to take
    over (the ISR, streamq.cluster.isr); none otherwise. A clustered node alone (its
    followers stopped, or none yet) is critical: RabbitMQ counts stopped members too."""
    cluster = broker.cluster
    assert cluster is not None
    others = [row for row in cluster.nodes() if not row.is_self]
    if any(row.in_isr and row.connected for row in others):
        return []
    return [
        {
            "readable_name": f"queue '{name}' in vhost '{vhost.name}'",
            "name": name,
            "virtual_host": vhost.name,
            "type": queue_type_of(queue),
        }
        for vhost in broker.vhosts.values()
        for name, queue in vhost.queues.items()
        if queue.persisted
    ]


QUORUM_CRITICAL: Final = (
    "There are quorum queues that would lose their quorum if the target node is shut down"
)
MIRROR_SYNC_CRITICAL: Final = (
    "There are classic mirrored queues without online synchronised mirrors"
)


def _critical(broker: Broker, reason: str) -> web.Response:
    if broker.cluster is None:  # run without --clustering
        return ok(reason="single node cluster")
    queues = critical_queues(broker)
    return failed(reason, queues=queues) if queues else ok()


@routes.get("/api/health/checks/node-is-quorum-critical")
async def check_node_is_quorum_critical(request: web.Request) -> web.Response:
    return _critical(caller(request).broker, QUORUM_CRITICAL)


# RabbitMQ 3.10's check for classic mirrored queues: streamq's replicas mirror every
# queue, so it is the same check, in RabbitMQ's words for mirrors.
@routes.get("/api/health/checks/node-is-mirror-sync-critical")
async def check_node_is_mirror_sync_critical(request: web.Request) -> web.Response:
    return _critical(caller(request).broker, MIRROR_SYNC_CRITICAL)


def _seconds_within(within: str, unit: str) -> float:
    if INTEGER.fullmatch(within) is None:
        raise HttpError(400, "Invalid expiration value.")
    per_unit = UNIT_S.get(unit.lower())
    if per_unit is None:
        raise HttpError(
            400, "Time unit not recognised. Supported units: days, weeks, months, years."
        )
    return int(within) * per_unit


def _date_text(seconds: int) -> str:
    """Erlang's "~w-~2.2.0w-~2.2.0w ~w:~2.2.0w:~2.2.0w" of a UTC time (hour unpadded)."""
    t = time.gmtime(seconds)
    return f"{t.tm_year}-{t.tm_mon:02}-{t.tm_mday:02} {t.tm_hour}:{t.tm_min:02}:{t.tm_sec:02}"


def expiring(path: str, now_s: float, before_s: float) -> list[str]:
    """What RabbitMQ lists for one file: the expiry date of each certificate in it that
    expires before `before_s`, and the reason for each that is unusable (not yet valid,
    unreadable); [] for no file."""
    if not path:
        return []
    try:
        entries: list[Validity | str] = read_pem(path)
    except (OSError, CertificateUnreadable) as exc:
        return [getattr(exc, "strerror", None) or str(exc)]
    found = []
    for entry in entries:
        if isinstance(entry, str):
            found.append(entry)
        elif entry.not_before_s > now_s:
            found.append("Certificate is not yet valid")
        elif entry.not_after_s < before_s:
            found.append(_date_text(entry.not_after_s))
    return found


# An empty `within` is RabbitMQ's 400 (cowboy matches an empty inner segment; a last
# one empty is the path without it: 404 for both).
@routes.get("/api/health/checks/certificate-expiration/{within:[^/]*}/{unit}")
async def check_certificate_expiration(request: web.Request) -> web.Response:
    seconds = _seconds_within(request.match_info["within"], request.match_info["unit"])
    broker = caller(request).broker
    certfile, cacertfile = broker.tls_files
    now_s = time.time()
    # Read once for all listeners (they share the files), on a worker thread.
    cert = await asyncio.to_thread(expiring, certfile, now_s, now_s + seconds)
    ca = await asyncio.to_thread(expiring, cacertfile, now_s, now_s + seconds)
    found = []
    for protocol, host, port in broker.listeners:
        if protocol in TLS_PROTOCOLS and (cert or ca):
            found.append(
                {
                    "node": this_node_name(broker),
                    "protocol": protocol,
                    "interface": host,
                    "port": port,
                    "certfile": certfile,
                    "cacertfile": cacertfile,
                    "certfile_expires_on": cert,
                    "cacertfile_expires_on": ca,
                }
            )
    if found:
        return failed("Certificates expiring", expired=found)
    return ok()
