"""`streamq ctl` shovel and federation verbs on a running broker, over HTTP.

Owns how the shovel and federation verbs (rabbitmqctl's and lavinmqctl's habits) map onto
the management API: a shovel or upstream is a runtime parameter (`/api/parameters/shovel`,
`/api/parameters/federation-upstream`) whose value takes RabbitMQ's keys, given as flags
named after them (`--src-uri` for "src-uri") or whole as `--value JSON` (flags given too
override its keys); the broker validates it. Status comes from `/api/shovels` and
`/api/federation-links`.
"""

from __future__ import annotations

import argparse
import json
from typing import Final

from streamq.ctlhttp.client import ApiClient, CtlError, JsonValue, path
from streamq.ctlhttp.output import Done, Result, Table

ACK_MODES: Final = ("on-confirm", "on-publish", "no-ack")
SHOVEL_COLUMNS: Final = ("vhost", "name", "state", "transferred", "src_uri", "dest_uri", "error")
UPSTREAM_COLUMNS: Final = ("vhost", "name", "value")
LINK_COLUMNS: Final = ("vhost", "name", "type", "upstream", "status", "uri", "error")
# Flags whose value is a list in RabbitMQ's keys (repeat the flag for several URIs).
URI_KEYS: Final = frozenset({"src-uri", "dest-uri", "uri"})
JSON_KEYS: Final = frozenset({"src-consumer-args"})
# `--uri` is ctl's own flag (the management API to call): the upstream's is --upstream-uri.
FLAG_NAMES: Final = {"uri": "upstream-uri"}


def _dest(key: str) -> str:
    return FLAG_NAMES.get(key, key).replace("-", "_")


def _add(sub: argparse.ArgumentParser, key: str, kind: str, text: str) -> None:
    """A flag named after RabbitMQ's value key; `kind`: text, int, number, flag, choice."""
    flag = "--" + FLAG_NAMES.get(key, key)
    if key in URI_KEYS:
        sub.add_argument(flag, action="append", metavar="URI", help=text + " (repeatable)")
    elif kind == "flag":
        sub.add_argument(flag, action="store_const", const=True, help=text)
    elif kind == "int":
        sub.add_argument(flag, type=int, metavar="N", help=text)
    elif kind == "number":
        sub.add_argument(flag, type=float, metavar="S", help=text)
    elif kind == "choice":
        sub.add_argument(flag, choices=ACK_MODES, help=text)
    else:
        sub.add_argument(flag, metavar="JSON" if key in JSON_KEYS else "TEXT", help=text)


def _value_option(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "--value", metavar="JSON", help="the whole value as JSON (RabbitMQ's keys); flags override"
    )


SHOVEL_FLAGS: Final = (
    ("src-uri", "text", "source broker, amqp[s]://user:pass@host:port/vhost (amqp:// = this)"),
    ("src-queue", "text", "queue to take messages from"),
    ("src-exchange", "text", "exchange to take messages from (through a queue of its own)"),
    ("src-exchange-key", "text", "routing key of that binding (#)"),
    ("src-prefetch-count", "int", "unacknowledged messages in flight (1000)"),
    ("src-delete-after", "text", "never, queue-length or a number of messages (never)"),
    ("src-consumer-args", "text", 'consumer arguments as JSON, e.g. {"x-stream-offset": "first"}'),
    ("dest-uri", "text", "destination broker, or an http(s):// endpoint to POST to"),
    ("dest-queue", "text", "queue to publish to"),
    ("dest-exchange", "text", "exchange to publish to"),
    ("dest-exchange-key", "text", "routing key to publish with (the message's own)"),
    ("dest-add-forward-headers", "flag", "add x-shovelled headers"),
    ("dest-add-timestamp-header", "flag", "add x-shovelled-timestamp"),
    ("ack-mode", "choice", "when the source is acked (on-confirm)"),
    ("reconnect-delay", "number", "seconds between reconnection attempts (1)"),
)
UPSTREAM_FLAGS: Final = (
    ("uri", "text", "upstream broker, amqp[s]://user:pass@host:port/vhost"),
    ("exchange", "text", "upstream exchange (the federated exchange's name)"),
    ("queue", "text", "upstream queue (the federated queue's name)"),
    ("prefetch-count", "int", "unacknowledged messages in flight (1000)"),
    ("reconnect-delay", "number", "seconds between reconnection attempts (5)"),
    ("ack-mode", "choice", "when the upstream is acked (on-confirm)"),
    ("trust-user-id", "flag", "keep user_id of messages from the upstream"),
    ("max-hops", "int", "brokers a message may pass through (1)"),
    ("expires", "int", "ms the upstream queue lives after the link goes"),
    ("message-ttl", "int", "ms messages live in the upstream queue"),
)


def shovel_options(sub: argparse.ArgumentParser) -> None:
    for key, kind, text in SHOVEL_FLAGS:
        _add(sub, key, kind, text)
    _value_option(sub)


def upstream_options(sub: argparse.ArgumentParser) -> None:
    for key, kind, text in UPSTREAM_FLAGS:
        _add(sub, key, kind, text)
    _value_option(sub)


def _json(flag: str, text: str) -> JsonValue:
    try:
        value: JsonValue = json.loads(text)
    except ValueError as exc:
        raise CtlError(f"{flag} is not JSON: {exc}") from None
    return value


def _flag_value(key: str, given: object) -> JsonValue:
    if key in URI_KEYS:
        assert isinstance(given, list)
        return given[0] if len(given) == 1 else list(given)
    if key in JSON_KEYS:
        return _json("--" + key, str(given))
    if key == "src-delete-after" and str(given).isdigit():
        return int(str(given))
    assert isinstance(given, str | int | float | bool)
    return given


def parameter_value(args: argparse.Namespace, flags: tuple[tuple[str, str, str], ...]) -> JsonValue:
    """The value to PUT: `--value` if given, with the flags given set on top."""
    value: dict[str, JsonValue] = {}
    if args.value is not None:
        whole = _json("--value", args.value)
        if not isinstance(whole, dict):
            raise CtlError("--value must be a JSON object")
        value.update(whole)
    for key, _, _ in flags:
        given = getattr(args, _dest(key))
        if given is not None:
            value[key] = _flag_value(key, given)
    return value


def _put(client: ApiClient, component: str, args: argparse.Namespace, value: JsonValue) -> None:
    client.request("PUT", path("parameters", component, args.vhost, args.name), {"value": value})


# Shovels.


def add_shovel(client: ApiClient, args: argparse.Namespace) -> Result:
    _put(client, "shovel", args, parameter_value(args, SHOVEL_FLAGS))
    return Done(f'Set shovel "{args.name}" in vhost "{args.vhost}".')


def list_shovels(client: ApiClient, args: argparse.Namespace) -> Result:
    """The shovels of the vhost given with -p, else of all."""
    rows = client.get_list(path("shovels", args.vhost) if args.vhost_given else "/api/shovels")
    return Table(SHOVEL_COLUMNS, [{c: row.get(c) for c in SHOVEL_COLUMNS} for row in rows])


def delete_shovel(client: ApiClient, args: argparse.Namespace) -> Result:
    client.request("DELETE", path("parameters", "shovel", args.vhost, args.name))
    return Done(f'Deleted shovel "{args.name}" in vhost "{args.vhost}".')


def restart_shovel(client: ApiClient, args: argparse.Namespace) -> Result:
    client.request("DELETE", path("shovels", "vhost", args.vhost, args.name, "restart"))
    return Done(f'Restarted shovel "{args.name}" in vhost "{args.vhost}".')


def pause_shovel(client: ApiClient, args: argparse.Namespace) -> Result:
    client.request("PUT", path("shovels", "vhost", args.vhost, args.name, "pause"))
    return Done(f'Paused shovel "{args.name}" in vhost "{args.vhost}".')


def resume_shovel(client: ApiClient, args: argparse.Namespace) -> Result:
    client.request("PUT", path("shovels", "vhost", args.vhost, args.name, "resume"))
    return Done(f'Resumed shovel "{args.name}" in vhost "{args.vhost}".')


# Federation.


def add_federation_upstream(client: ApiClient, args: argparse.Namespace) -> Result:
    _put(client, "federation-upstream", args, parameter_value(args, UPSTREAM_FLAGS))
    return Done(f'Set federation upstream "{args.name}" in vhost "{args.vhost}".')


def list_federation_upstreams(client: ApiClient, args: argparse.Namespace) -> Result:
    rows = client.get_list(path("parameters", "federation-upstream", args.vhost))
    shown = [
        {"vhost": r.get("vhost"), "name": r.get("name"), "value": r.get("value")} for r in rows
    ]
    return Table(UPSTREAM_COLUMNS, shown)


def delete_federation_upstream(client: ApiClient, args: argparse.Namespace) -> Result:
    client.request("DELETE", path("parameters", "federation-upstream", args.vhost, args.name))
    return Done(f'Deleted federation upstream "{args.name}" in vhost "{args.vhost}".')


def list_federation_links(client: ApiClient, args: argparse.Namespace) -> Result:
    """The federation links of the vhost given with -p, else of all."""
    where = path("federation-links", args.vhost) if args.vhost_given else "/api/federation-links"
    rows = client.get_list(where)
    return Table(LINK_COLUMNS, [{c: row.get(c) for c in LINK_COLUMNS} for row in rows])
