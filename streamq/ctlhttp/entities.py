"""`streamq ctl` queue, exchange and policy verbs on a running broker, over HTTP.

Owns how lavinmqctl's verbs for queues, exchanges and policies map onto RabbitMQ's
management API (`/api/queues`, `/api/exchanges`, `/api/policies`), including the
`create_queue` and `create_exchange` flags that become declare arguments.
"""

from __future__ import annotations

import argparse
import json
from typing import Final

from streamq.ctlhttp.client import ApiClient, CtlError, JsonValue, path
from streamq.ctlhttp.output import Done, Result, Table

QUEUE_COLUMNS: Final = (
    "name",
    "type",
    "durable",
    "messages",
    "messages_ready",
    "messages_unacknowledged",
    "consumers",
)
EXCHANGE_COLUMNS: Final = ("name", "type", "durable", "auto_delete", "internal")
POLICY_COLUMNS: Final = ("vhost", "name", "pattern", "apply-to", "definition", "priority")
APPLY_TO: Final = ("all", "queues", "exchanges", "classic_queues", "streams")
DELAYED_TYPE: Final = "x-delayed-message"  # RabbitMQ's delayed message exchange plugin


def _columns(args: argparse.Namespace, default: tuple[str, ...]) -> tuple[str, ...]:
    """The info items given on the command line (rabbitmqctl's `list_queues name messages`)."""
    return tuple(args.columns) if args.columns else default


def _pick(
    columns: tuple[str, ...], items: list[dict[str, JsonValue]]
) -> list[dict[str, JsonValue]]:
    return [{column: item.get(column) for column in columns} for item in items]


# Queues.


def list_queues(client: ApiClient, args: argparse.Namespace) -> Result:
    columns = _columns(args, QUEUE_COLUMNS)
    return Table(columns, _pick(columns, client.get_list(path("queues", args.vhost))))


def create_queue(client: ApiClient, args: argparse.Namespace) -> Result:
    body: JsonValue = {
        # Streams are durable in RabbitMQ and LavinMQ alike: --stream-queue implies --durable.
        "durable": args.durable or args.stream_queue,
        "auto_delete": args.auto_delete,
        "arguments": queue_arguments(args),
    }
    client.request("PUT", path("queues", args.vhost, args.name), body)
    return Done(f'Declared queue "{args.name}" in vhost "{args.vhost}".')


def queue_arguments(args: argparse.Namespace) -> dict[str, JsonValue]:
    """The `x-` arguments of lavinmqctl's create_queue flags, only those given."""
    given: dict[str, JsonValue] = {
        "x-expires": args.expires,
        "x-max-length": args.max_length,
        "x-message-ttl": args.message_ttl,
        "x-delivery-limit": args.delivery_limit,
        "x-overflow": "reject-publish" if args.reject_on_overflow else None,
        "x-dead-letter-exchange": args.dead_letter_exchange,
        "x-dead-letter-routing-key": args.dead_letter_routing_key,
        "x-queue-type": "stream" if args.stream_queue else None,
    }
    return {name: value for name, value in given.items() if value is not None}


def purge_queue(client: ApiClient, args: argparse.Namespace) -> Result:
    client.request("DELETE", path("queues", args.vhost, args.name, "contents"))
    return Done(f'Purged queue "{args.name}" in vhost "{args.vhost}".')


def delete_queue(client: ApiClient, args: argparse.Namespace) -> Result:
    conditions = [
        f"{flag}=true"
        for flag, on in (("if-unused", args.if_unused), ("if-empty", args.if_empty))
        if on
    ]
    query = "?" + "&".join(conditions) if conditions else ""
    client.request("DELETE", path("queues", args.vhost, args.name) + query)
    return Done(f'Deleted queue "{args.name}" in vhost "{args.vhost}".')


# Exchanges.


def list_exchanges(client: ApiClient, args: argparse.Namespace) -> Result:
    columns = _columns(args, EXCHANGE_COLUMNS)
    return Table(columns, _pick(columns, client.get_list(path("exchanges", args.vhost))))


def create_exchange(client: ApiClient, args: argparse.Namespace) -> Result:
    client.request("PUT", path("exchanges", args.vhost, args.name), exchange_body(args))
    return Done(f'Declared exchange "{args.name}" in vhost "{args.vhost}".')


def exchange_body(args: argparse.Namespace) -> dict[str, JsonValue]:
    """The declare body: `--delayed` makes an `x-delayed-message` exchange that routes as
    TYPE once a message's `x-delay` is over (the plugin's `x-delayed-type`)."""
    arguments: dict[str, JsonValue] = {}
    if args.delayed:
        arguments["x-delayed-type"] = args.type
    if args.alternate_exchange is not None:
        arguments["alternate-exchange"] = args.alternate_exchange
    return {
        "type": DELAYED_TYPE if args.delayed else args.type,
        "durable": args.durable,
        "auto_delete": args.auto_delete,
        "internal": args.internal,
        "arguments": arguments,
    }


def delete_exchange(client: ApiClient, args: argparse.Namespace) -> Result:
    query = "?if-unused=true" if args.if_unused else ""
    client.request("DELETE", path("exchanges", args.vhost, args.name) + query)
    return Done(f'Deleted exchange "{args.name}" in vhost "{args.vhost}".')


# Policies.


def list_policies(client: ApiClient, args: argparse.Namespace) -> Result:
    return Table(
        POLICY_COLUMNS, _pick(POLICY_COLUMNS, client.get_list(path("policies", args.vhost)))
    )


def set_policy(client: ApiClient, args: argparse.Namespace) -> Result:
    try:
        definition: JsonValue = json.loads(args.definition)
    except ValueError as exc:
        raise CtlError(f"the definition is not JSON: {exc}") from None
    body: JsonValue = {
        "pattern": args.pattern,
        "definition": definition,
        "priority": args.priority,
        "apply-to": args.apply_to,
    }
    client.request("PUT", path("policies", args.vhost, args.name), body)
    return Done(f'Set policy "{args.name}" in vhost "{args.vhost}".')


def clear_policy(client: ApiClient, args: argparse.Namespace) -> Result:
    client.request("DELETE", path("policies", args.vhost, args.name))
    return Done(f'Cleared policy "{args.name}" in vhost "{args.vhost}".')
