"""Routing of a publish whose properties matter: the slow path beside the hot one.

Owns what a publish does when its exchange reads the message's properties (headers,
delayed, consistent hash on a header or property, deduplication), when a queue
deduplicates, or when the properties carry `CC`/`BCC` headers or a `reply_to` of
`amq.rabbitmq.reply-to`. `needs_slow_path` decides that from the exchange's flags and
a few byte searches of the raw properties, so a message that uses none of it is never
decoded (STYLE.md section 11).

RabbitMQ's rules kept here:
- `CC` and `BCC` are arrays of routing keys: the message is also routed with each of
  them on the same exchange; `BCC` is removed before the message is stored. Array
  elements that are not strings are ignored; a `CC` or `BCC` that is not an array is a
  406 "invalid message: {unacceptable_type_in_header,"CC",longstr}".
- A delayed exchange holds a message with an `x-delay` above 0 (and at most 2^32 - 1)
  for that many ms, then routes it as its `x-delayed-type` (the message keeps its CC/BCC
  for then). As the plugin's `get_delay`, integer types count, a string is parsed as an
  integer and a float is truncated. The held copy's `x-delay` becomes `-delay` (the
  plugin's `swap_delay_header`: not delayed again, and consumers can tell). Held messages
  count as unrouted: with `mandatory` they are returned at once (as they were
  published), as the plugin does (it cannot know the queues of the future).
- LavinMQ's delayed exchanges (`x-delayed-exchange: true` or the policy key
  `delayed-message`) hold the same way, but drop `x-delay` from the held copy and count
  a held message as routed (no return), as LavinMQ's delayed exchange queue does.
- A duplicate (LavinMQ's deduplication) of an exchange is not routed (hence returned
  when mandatory); for a queue, that queue does not take it. Both are still confirmed.
"""

from __future__ import annotations

import dataclasses
import math
import re
from decimal import Decimal
from typing import Final, NamedTuple

from amqp_gateway import codec, errors
from amqp_gateway.codec.erlang_text import ErlangTerm, column, string_term, term
from amqp_gateway.reply_to import REPLY_TO_QUEUE
from streamq.broker.equivalence import type_name
from streamq.broker.exchange import Exchange
from streamq.broker.queue import Queue
from streamq.broker.vhost import VHost
from streamq.broker.vhost_routing import RouteFields

HEADERS_FLAG_BYTE0: Final = 0x20  # property flags: bit 13, headers
REPLY_TO_FLAG_BYTE0: Final = 0x02  # property flags: bit 9, reply-to
SLOW_FLAGS_BYTE0: Final = HEADERS_FLAG_BYTE0 | REPLY_TO_FLAG_BYTE0
EXPIRATION_FLAG_BYTE0: Final = 0x01  # property flags: bit 8, expiration
USER_ID_FLAG_BYTE1: Final = 0x10  # property flags: bit 4, user-id
# In a whole flag word (a PublishRun's flags): what the slow path looks at, and the
# properties every publish has checked (`check_properties`).
SLOW_FLAGS: Final = SLOW_FLAGS_BYTE0 << 8
CHECKED_FLAGS: Final = EXPIRATION_FLAG_BYTE0 << 8 | USER_ID_FLAG_BYTE1
EXPIRY_MS_MAX: Final = 315_360_000_000  # rabbit_misc:check_expiry/1: ten years
# Field table keys are shortstrs: a length octet, then the name.
CC_KEY: Final = b"\x02CC"
BCC_KEY: Final = b"\x03BCC"
REPLY_TO_MARK: Final = REPLY_TO_QUEUE.encode()
PERSISTENT: Final = 2  # delivery-mode
DELAY_MS_MAX: Final = 4294967295  # the plugin's limit: Erlang's longest timer
_INTEGER: Final = re.compile(r"[+-]?[0-9]+")  # what Erlang's binary_to_integer takes


class Routed(NamedTuple):
    queues: list[Queue]
    properties_raw: bytes  # as stored and delivered (BCC removed, reply-to rewritten)
    held: bool  # delayed or a duplicate: not routed now
    routed_later: bool = False  # held by a LavinMQ-style delayed exchange: counts as routed


def needs_check(properties_raw: bytes) -> bool:
    """Hot path: whether the properties carry a user-id or an expiration (flag bits)."""
    return bool(properties_raw) and bool(
        properties_raw[0] & EXPIRATION_FLAG_BYTE0 or properties_raw[1] & USER_ID_FLAG_BYTE1
    )


def check_properties(properties_raw: bytes, user: str, impersonator: bool) -> None:
    """RabbitMQ's checks of every publish (rabbit_channel's check_user_id_header and
    check_expiration_header): a user-id must be the connection's user unless that user
    is tagged impersonator; an expiration must be a decimal integer of 0 to ten years.
    Raises PreconditionFailed (406) in RabbitMQ's words."""
    properties = codec.decode_properties(properties_raw)
    claimed = properties.user_id
    if claimed is not None and claimed != user and not impersonator:
        raise errors.PreconditionFailed(
            f"user_id property set to '{claimed}' but authenticated user was '{user}'", 60, 40
        )
    expiration = properties.expiration
    if expiration is not None:
        problem = expiration_problem(expiration)
        if problem is not None:
            raise errors.PreconditionFailed(f"invalid expiration '{expiration}': {problem}", 60, 40)


def expiration_problem(expiration: str) -> str | None:
    """Why RabbitMQ refuses `expiration`, printed as its "invalid expiration '~s': ~p"
    prints the error term; None if it takes it. The parse is Erlang's
    string:to_integer/1 (a sign, digits, nothing more), the bounds rabbit_misc's
    check_expiry/1 (0 to ten years)."""
    match = _INTEGER.match(expiration)
    if match is None:
        return "no_integer"
    rest = expiration[match.end() :]
    reason: ErlangTerm
    if rest:
        reason = ("leftover_string", string_term(rest.encode("utf-8", "surrogateescape")))
    else:
        value = int(match[0])
        if 0 <= value <= EXPIRY_MS_MAX:
            return None
        reason = ("value_negative" if value < 0 else "value_too_large", value)
    # ~p prints the term from where the format put it, breaking a tuple that would end
    # past column 78 (erlang_text.term; checked against erl on 4,000 generated values).
    # Not followed: the fill of a list of unprintable bytes too long for its line, and
    # some long strings holding a newline, which ~p keeps flat.
    return term(reason, column(f"invalid expiration '{expiration}': "))


def needs_slow_path(vhost: VHost, exchange: Exchange, properties_raw: bytes) -> bool:
    """Hot path: whether `route_publish` must look at this message."""
    if exchange.reads_properties or vhost.queue_dedupers:
        return True
    if not properties_raw:
        return False
    flags = properties_raw[0]
    if flags & HEADERS_FLAG_BYTE0 and (CC_KEY in properties_raw or BCC_KEY in properties_raw):
        return True
    return bool(flags & REPLY_TO_FLAG_BYTE0) and REPLY_TO_MARK in properties_raw


def route_publish(
    vhost: VHost,
    exchange: Exchange,
    routing_key: str,
    properties_raw: bytes,
    body: bytes,
    now_ms: int,
    reply_suffix: str | None,
) -> Routed:
    """Route a publish that `needs_slow_path`. `reply_suffix` is the publishing
    channel's direct reply-to name, None if it has no reply consumer. Raises
    PreconditionFailed (406) for CC/BCC of a wrong type and for a reply_to of
    `amq.rabbitmq.reply-to` on a channel without reply consumer."""
    properties = codec.decode_properties(properties_raw)
    if properties.reply_to == REPLY_TO_QUEUE:
        if reply_suffix is None:
            raise errors.PreconditionFailed("fast reply consumer does not exist", 60, 40)
        properties = dataclasses.replace(properties, reply_to=f"{REPLY_TO_QUEUE}.{reply_suffix}")
        properties_raw = codec.encode_properties(properties)
    headers = properties.headers
    if exchange.deduper is not None and exchange.deduper.duplicate(headers, now_ms):
        return Routed([], properties_raw, True)
    if exchange.delayed and headers:
        delay = delay_ms(headers)
        if delay is not None:
            held = dict(headers)
            if exchange.delayed_lavinmq:
                del held["x-delay"]
            else:
                held["x-delay"] = -delay
            held_raw = codec.encode_properties(dataclasses.replace(properties, headers=held))
            persistent = properties.delivery_mode == PERSISTENT
            # now_ms is the read's time floored to the ms: one ms more, so that a message
            # is never released before `delay` ms have passed since it arrived.
            deadline_ms = now_ms + delay + 1
            vhost.delay(exchange, routing_key, held_raw, body, deadline_ms, persistent)
            return Routed([], properties_raw, True, exchange.delayed_lavinmq)
    return route_now(vhost, exchange, routing_key, properties, properties_raw, now_ms)


def delay_ms(headers: codec.FieldTable) -> int | None:
    """The message's delay as the plugin reads `x-delay`; None if it is not delayed."""
    value = headers.get("x-delay")
    delay: int
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        delay = value
    elif isinstance(value, float | Decimal) and math.isfinite(value):
        delay = math.trunc(value)
    elif isinstance(value, str) and _INTEGER.fullmatch(value):
        delay = int(value)
    else:
        return None
    return delay if 0 < delay <= DELAY_MS_MAX else None


def fields_for_route(properties_raw: bytes) -> RouteFields:
    """A message's headers and `hash-property` fields, for a route that reaches an
    exchange reading them (`VHost.route` calls it at most once per message)."""
    properties = codec.decode_properties(properties_raw)
    return properties.headers, _hashed_properties(properties)


def _hashed_properties(properties: codec.BasicProperties) -> dict[str, object]:
    return {
        "message_id": properties.message_id,
        "correlation_id": properties.correlation_id,
        "timestamp": properties.timestamp,
    }


def route_now(
    vhost: VHost,
    exchange: Exchange,
    routing_key: str,
    properties: codec.BasicProperties,
    properties_raw: bytes,
    now_ms: int,
) -> Routed:
    """Route with CC and BCC and the queues' deduplication, not delaying: a publish,
    or a delayed message whose time has come."""
    headers = properties.headers
    keys = [routing_key]
    if headers and ("CC" in headers or "BCC" in headers):
        keys += extra_routing_keys(headers, "CC") + extra_routing_keys(headers, "BCC")
        if "BCC" in headers:
            headers = {k: v for k, v in headers.items() if k != "BCC"}
            properties = dataclasses.replace(properties, headers=headers)
            properties_raw = codec.encode_properties(properties)
    # Built for every slow-path message: an exchange further on may hash by property.
    by_property = _hashed_properties(properties)
    queues = vhost.route(exchange.name, routing_key, headers, by_property)
    for key in keys[1:]:
        for queue in vhost.route(exchange.name, key, headers, by_property):
            if queue not in queues:
                queues.append(queue)
    if vhost.queue_dedupers and queues:
        queues = vhost.duplicate_free(queues, headers, now_ms)
    return Routed(queues, properties_raw, False)


def extra_routing_keys(headers: codec.FieldTable, name: str) -> list[str]:
    """The routing keys of the `CC` or `BCC` header (RabbitMQ's `header_routes`)."""
    value = headers.get(name)
    if value is None:
        return []
    if not isinstance(value, list):
        raise errors.PreconditionFailed(
            f'invalid message: {{unacceptable_type_in_header,"{name}",{type_name(value)}}}',
            60,
            40,
        )
    return [key for key in value if isinstance(key, str)]


def release_delayed(vhost: VHost, now_ms: int) -> int:
    """Route and store the delayed messages whose time has come; returns how many.
    A message whose exchange is gone meanwhile is dropped; one whose exchange no longer
    delays (a LavinMQ policy went away) is released all the same."""
    due = vhost.due_delayed(now_ms)
    for message in due:
        exchange = vhost.exchanges.get(message.exchange)
        if exchange is None:
            continue
        properties = codec.decode_properties(message.properties_raw)
        routed = route_now(
            vhost, exchange, message.routing_key, properties, message.properties_raw, now_ms
        )
        vhost.publish(
            message.exchange,
            message.routing_key,
            routed.properties_raw,
            message.body,
            routed.queues,
            now_ms,
        )
    return len(due)
