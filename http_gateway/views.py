"""RabbitMQ's JSON for runtime objects, and the checks the routes on them share.

Owns how queues, exchanges, bindings, connections, channels and consumers look in the
management API (RabbitMQ's field names), which connections a user may see, the AMQP
permission checks of a write (`require_permission`, `require_topic_permission`) and
binding `properties_key`s. It reads broker state; it changes nothing.
"""

from __future__ import annotations

import base64
import hashlib
import json
import socket
from collections.abc import Mapping
from typing import Final
from urllib.parse import quote_plus, unquote_plus

from http_gateway.context import SEES_ALL_VHOSTS_TAGS, Caller
from http_gateway.errors import HttpError
from streamq.broker.accounts import PermissionKind
from streamq.broker.broker import Broker
from streamq.broker.clients import ChannelInfo, Client, ConsumerInfo
from streamq.broker.exchange import Binding, Exchange
from streamq.broker.policies import choose
from streamq.broker.queue import Queue
from streamq.broker.queue_arguments import QUORUM
from streamq.broker.topic_permissions import TopicKind, amqp_variables
from streamq.broker.vhost import VHost
from streamq.broker.vhost_store import PREDECLARED_NAMES

NODE: Final = f"streamq@{socket.gethostname()}"
PREDECLARED_BY: Final = "rmq-internal"  # RabbitMQ's ?INTERNAL_USER


def require_permission(
    who: Caller, vhost: str, kind: PermissionKind, resource: str, name: str
) -> None:
    """What AMQP would check: 403 unless the user's `kind` regex on `vhost` allows `name`."""
    if not who.broker.accounts.permitted(who.user.name, vhost, kind, name):
        shown = name or "amq.default"
        raise HttpError(
            403,
            f"access to {resource} '{shown}' in vhost '{vhost}' refused for user '{who.user.name}'",
        )


def require_topic_permission(
    who: Caller, vhost: VHost, kind: TopicKind, exchange: str, routing_key: str
) -> None:
    """What AMQP would check of a topic exchange (amqp_gateway/access.py): 403 unless the
    user's `kind` topic permission on `exchange` allows `routing_key`. Other exchanges,
    and missing ones, are not checked."""
    found = vhost.exchanges.get(exchange)
    if found is None or found.type != "topic":
        return
    user = who.user.name
    grants = who.broker.accounts.topic_grants(user, vhost.name)
    variables = amqp_variables(user, vhost.name)
    if grants is not None and not grants.permitted(exchange, kind, routing_key, variables):
        raise HttpError(
            403,
            f"access to topic '{routing_key}' in exchange '{exchange}' in vhost "
            f"'{vhost.name}' refused for user '{user}'",
        )


def sees_all_connections(who: Caller) -> bool:
    return who.has_any_tag(SEES_ALL_VHOSTS_TAGS)


def visible_clients(who: Caller, vhost: str | None = None) -> list[Client]:
    """The connections the caller may see (management users: their own), by name."""
    everyone = sees_all_connections(who)
    return [
        client
        for name, client in sorted(who.broker.clients.items())
        if (everyone or client.user == who.user.name) and (vhost is None or client.vhost == vhost)
    ]


def client_by_name(who: Caller, name: str) -> Client:
    client = who.broker.clients.get(name)
    if client is None or not (sees_all_connections(who) or client.user == who.user.name):
        raise HttpError(404, "Object Not Found")
    return client


# What RabbitMQ shows of a connection without TLS.
NO_TLS: Final[dict[str, object]] = dict.fromkeys(
    (
        "ssl_protocol",
        "ssl_key_exchange",
        "ssl_cipher",
        "ssl_hash",
        "peer_cert_subject",
        "peer_cert_issuer",
        "peer_cert_validity",
    )
)


def connection_json(client: Client, octet_rates: tuple[float, float]) -> dict[str, object]:
    """RabbitMQ's connection object; `octet_rates`: bytes per second received and sent
    over the last sampling interval (`Sampler.octet_rates`)."""
    recv_rate, send_rate = octet_rates
    return {
        "name": client.name,
        "node": NODE,
        # "direct" for the broker's own links (amqp_gateway/direct.py), as RabbitMQ.
        "type": getattr(client, "connection_type", "network"),
        "state": client.state,
        "protocol": client.protocol,
        "vhost": client.vhost,
        "user": client.user,
        "user_who_performed_action": client.user,
        "auth_mechanism": client.auth_mechanism,
        "ssl": client.tls is not None,
        **(client.tls if client.tls is not None else NO_TLS),
        "host": client.host,
        "port": client.port,
        "peer_host": client.peer_host,
        "peer_port": client.peer_port,
        "connected_at": client.connected_at_ms,
        "channels": len(client.channels()),
        "channel_max": client.channel_max,
        "frame_max": client.frame_max,
        "timeout": client.heartbeat_s,
        "client_properties": dict(client.client_properties),
        "recv_oct": client.recv_oct,
        "recv_oct_details": {"rate": round(recv_rate, 1)},
        "send_oct": client.send_oct,
        "send_oct_details": {"rate": round(send_rate, 1)},
    }


def channel_name(client: Client, number: int) -> str:
    return f"{client.name} ({number})"


def channel_details(client: Client, number: int) -> dict[str, object]:
    return {
        "name": channel_name(client, number),
        "number": number,
        "node": NODE,
        "connection_name": client.name,
        "peer_host": client.peer_host,
        "peer_port": client.peer_port,
        "user": client.user,
    }


def channel_json(client: Client, info: ChannelInfo) -> dict[str, object]:
    return {
        "name": channel_name(client, info.number),
        "number": info.number,
        "node": NODE,
        "state": info.state,
        "vhost": client.vhost,
        "user": client.user,
        "user_who_performed_action": client.user,
        "connection_details": {
            "name": client.name,
            "peer_host": client.peer_host,
            "peer_port": client.peer_port,
        },
        "consumer_count": len(info.consumers),
        "messages_unacknowledged": info.messages_unacknowledged,
        "messages_unconfirmed": info.messages_unconfirmed,
        "messages_uncommitted": info.messages_uncommitted,
        "acks_uncommitted": info.acks_uncommitted,
        "prefetch_count": info.prefetch_count,
        "global_prefetch_count": info.global_prefetch_count,
        "confirm": info.confirm,
        "transactional": info.transactional,
        "consumer_details": [consumer_json(client, info.number, c) for c in info.consumers],
    }


def consumer_json(client: Client, number: int, consumer: ConsumerInfo) -> dict[str, object]:
    return {
        "consumer_tag": consumer.tag,
        "channel_details": channel_details(client, number),
        "queue": {"name": consumer.queue, "vhost": client.vhost},
        "ack_required": consumer.ack_required,
        "exclusive": consumer.exclusive,
        "prefetch_count": consumer.prefetch_count,
        "arguments": dict(consumer.arguments),
        "active": consumer.active,
        "activity_status": consumer.activity_status,
    }


def consumers_of(broker: Broker, vhost: str) -> dict[str, list[dict[str, object]]]:
    """consumer_details of every queue of `vhost`, by queue name."""
    out: dict[str, list[dict[str, object]]] = {}
    for client in broker.clients.values():
        if client.vhost != vhost:
            continue
        for info in client.channels():
            for c in info.consumers:
                out.setdefault(c.queue, []).append(consumer_json(client, info.number, c))
    return out


def queue_type_of(queue: Queue) -> str:
    return "stream" if queue.arguments.get("x-queue-type") == "stream" else "classic"


def queue_json(
    vhost: VHost,
    queue: Queue,
    consumers: list[dict[str, object]],
) -> dict[str, object]:
    kind = queue_type_of(queue)
    policy = choose(vhost.policies, "queue", queue.name, kind)
    operator = choose(vhost.operator_policies, "queue", queue.name, kind)
    out: dict[str, object] = {
        "name": queue.name,
        "vhost": vhost.name,
        "node": NODE,
        "type": kind,
        "durable": queue.durable,
        "auto_delete": queue.auto_delete,
        "exclusive": queue.exclusive,
        "arguments": queue.arguments,
        "policy": policy.name if policy is not None else None,
        "operator_policy": operator.name if operator is not None else None,
        "effective_policy_definition": queue.policy,
        "state": "running" if queue.failed is None else "crashed",
        "consumers": len(queue.consumers),
        "consumer_details": consumers,
        "message_stats": queue.stats.to_json(),
    }
    if queue.failed is not None:
        out["reason"] = queue.failed
    stream = queue.stream
    if stream is not None:
        log = stream.log
        out.update(
            messages=stream.message_count,
            messages_ready=stream.message_count,
            messages_unacknowledged=0,
            first_offset=log.start_offset,
            last_offset=log.next_offset - 1,
            committed_offset=log.durable_next - 1,
            segments=log.segment_count,
            # Records lost to damage on disk (bit rot), skipped by every consumer.
            damaged_messages=log.damage.records,
        )
        return out
    # RabbitMQ's classic queues list both, null when no consumer holds the queue.
    out["exclusive_consumer_tag"] = queue.exclusive_consumer_tag
    out["single_active_consumer_tag"] = queue.single_active_consumer_tag
    cursor = queue.cursor
    ready = cursor.message_count
    unacked = cursor.unacked_count
    out.update(
        # As RabbitMQ's quorum queues, the dead letters held count (see messages_dlx).
        messages=ready + unacked + len(cursor.dead),
        messages_ready=ready,
        messages_unacknowledged=unacked,
        message_bytes=cursor.bytes_ready + cursor.bytes_unacked,
        message_bytes_ready=cursor.bytes_ready,
        message_bytes_unacknowledged=cursor.bytes_unacked,
        # Message bodies stay in the log, not in memory: the queue's memory is its
        # cursor's runs and its messages in flight.
        memory=cursor.run_count * 16 + unacked * 100,
        # Its messages lost to damage on disk (bit rot) and dropped, never delivered.
        damaged_messages=cursor.damaged_messages,
    )
    if queue.arguments.get("x-queue-type") == QUORUM:
        # As RabbitMQ's quorum queues: the dead letters held until their targets have
        # them (at-least-once dead-lettering), apart from `messages`.
        out.update(messages_dlx=len(cursor.dead), message_bytes_dlx=cursor.bytes_dead)
    return out


def _predeclared_by(name: str) -> str:
    """As RabbitMQ shows who made the exchanges every vhost starts with (its internal user
    for those of a vhost made at boot); "" for other exchanges of unknown origin."""
    return PREDECLARED_BY if name in PREDECLARED_NAMES else ""


def exchange_json(vhost: VHost, exchange: Exchange) -> dict[str, object]:
    policy = choose(vhost.policies, "exchange", exchange.name, "")
    stats = vhost.exchange_stats.get(exchange.name)
    return {
        "name": exchange.name,
        "vhost": vhost.name,
        "type": exchange.type,
        "durable": exchange.durable,
        "auto_delete": exchange.auto_delete,
        "internal": exchange.internal,
        "arguments": exchange.arguments,
        "policy": policy.name if policy is not None else None,
        "user_who_performed_action": exchange.user or _predeclared_by(exchange.name),
        "message_stats": stats.to_json() if stats is not None else {},
    }


# -- bindings ------------------------------------------------------------------------------


def _quote(text: str) -> str:
    # RabbitMQ's quote_binding: mochiweb's quote_plus (a space is "+", all but letters,
    # digits and "-._~" escaped), then "~" escaped too, as it starts the arguments' hash.
    return quote_plus(text, safe="").replace("~", "%7E")


def properties_key(routing_key: str, arguments: Mapping[str, object]) -> str:
    """RabbitMQ's binding key in paths: the routing key ("~" when empty), and "~" and a
    hash of the arguments when there are any."""
    if not arguments:
        return _quote(routing_key) if routing_key else "~"
    digest = hashlib.sha256(json.dumps(arguments, sort_keys=True, default=str).encode())
    hashed = base64.urlsafe_b64encode(digest.digest()[:12]).decode()
    return f"{_quote(routing_key)}~{hashed}"


def unfrozen(arguments: tuple[tuple[str, object], ...]) -> dict[str, object]:
    return {key: value for key, value in arguments}


def binding_json(vhost: str, source: str, binding: Binding) -> dict[str, object]:
    arguments = unfrozen(binding.arguments)
    return {
        "source": source,
        "vhost": vhost,
        "destination": binding.destination.name,
        "destination_type": binding.destination.kind,
        "routing_key": binding.routing_key,
        "arguments": arguments,
        "properties_key": properties_key(binding.routing_key, arguments),
    }


def default_binding_json(vhost: str, queue: str) -> dict[str, object]:
    """The default exchange's implicit binding of every queue, as RabbitMQ lists it."""
    return {
        "source": "",
        "vhost": vhost,
        "destination": queue,
        "destination_type": "queue",
        "routing_key": queue,
        "arguments": {},
        "properties_key": _quote(queue),
    }


def all_bindings(vhost: VHost) -> list[dict[str, object]]:
    out = [default_binding_json(vhost.name, name) for name in sorted(vhost.queues)]
    for name, exchange in sorted(vhost.exchanges.items()):
        out += [
            binding_json(vhost.name, name, b)
            for b in sorted(exchange.bindings, key=lambda b: (b.destination, b.routing_key))
        ]
    return out


def routing_key_of(props: str) -> str:
    """The routing key part of a properties_key (the part before "~")."""
    return unquote_plus(props.split("~", 1)[0])
