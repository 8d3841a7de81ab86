"""Known, deliberate differences from RabbitMQ 3.10: one entry per scenario, each with
the reason, and a mask that removes only what differs from both brokers' observations
before they are compared (the rest of the scenario is still compared).
docs/compatibility.md lists them for users."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from tests.differential.wire import Observation

Mask = Callable[[list[Observation]], list[Observation]]


@dataclass(frozen=True)
class Difference:
    reason: str
    mask: Mask
    better: bool = False  # where we choose to behave better than RabbitMQ


ALLOWED: dict[str, Difference] = {}


def _without_delivery_count(observations: list[Observation]) -> list[Observation]:
    """Drops `x-delivery-count` from the headers of every content read (and the headers
    table if that was all it held)."""
    masked = []
    for o in observations:
        if len(o) > 5 and o[1] == "content" and "x-delivery-count" in o[5].get("headers", {}):
            headers = {k: v for k, v in o[5]["headers"].items() if k != "x-delivery-count"}
            properties = {k: v for k, v in o[5].items() if k != "headers"}
            if headers:
                properties["headers"] = headers
            masked.append((*o[:5], properties, *o[6:]))
        else:
            masked.append(o)
    return masked


_DELIVERY_COUNT = Difference(
    reason="streamq's classic queues count deliveries (for x-delivery-limit, docs/queues.md) "
    "and redeliveries carry x-delivery-count; RabbitMQ 3.10 adds it on quorum queues only",
    mask=_without_delivery_count,
    better=True,
)
for _name in (
    "basic.get redelivered after nack with requeue",
    "basic.get redelivered after reject with requeue",
    "basic.get redelivered after recover with requeue",
    "basic.get redelivered after channel close with requeue",
    "basic.nack multiple with requeue redelivers them in order",
    "basic.recover requeue=True with a consumer",
    "basic.recover-async requeue=True with a consumer",
    "tx.commit applies nack and reject with requeue",
    "tx.rollback of an ack leaves the message unacked",
    "tx: closing the channel requeues what the open transaction acked",
    "basic.consume redelivers to another consumer what a closed channel left unacked",
):
    ALLOWED[_name] = _DELIVERY_COUNT


def _delivery_limit_text(observations: list[Observation]) -> list[Observation]:
    """The reply text of the close that refuses `x-delivery-limit`, blanked."""
    masked = []
    for o in observations:
        fields = o[4] if len(o) > 4 and isinstance(o[4], dict) else {}
        if o[3:4] == ("channel.close",) and "'x-delivery-limit'" in fields.get("reply_text", ""):
            masked.append((*o[:4], {**fields, "reply_text": "<x-delivery-limit refused>"}))
        else:
            masked.append(o)
    return masked


ALLOWED["queue.declare with x-delivery-limit=-1"] = Difference(
    reason="streamq has delivery limits on classic queues (docs/queues.md) and so checks the "
    "value ({value_negative,-1}); RabbitMQ 3.10 refuses the argument on a classic queue "
    "(\"invalid arg 'x-delivery-limit' ... of queue type rabbit_classic_queue\")",
    mask=_delivery_limit_text,
    better=True,
)


# The management API (tests/differential/scenarios/management.py). Records there are
# ("record", what, ...): a request's method, path and status, or ("get", request,
# status, messages).


def _each_record(change: Callable[[Observation], Observation]) -> Mask:
    """A mask applying `change` to every observation a scenario recorded."""
    return lambda observations: [change(o) if o[0] == "record" else o for o in observations]


def _deep(change: Callable[[object], object | None]) -> Callable[[Observation], Observation]:
    """`change` applied to every value inside a record, depth first; None keeps a value."""

    def walk(value: object) -> object:
        changed = change(value)
        if changed is not None:
            return changed
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(walk(v) for v in value)
        return value

    return lambda o: tuple(walk(v) for v in o)


def _amq_refusal(o: Observation) -> Observation:
    if o[1] == "PUT" and "/amq." in str(o[2]) and o[3] in (401, 403):
        return (*o[:3], "<refused>")
    return o


ALLOWED["http: PUT of a new amq. exchange is refused"] = Difference(
    reason="streamq answers 403 for every request it refuses for lack of rights, where "
    "RabbitMQ answers 401 (docs/management.md: 401 only for credentials that are wrong)",
    mask=_each_record(_amq_refusal),
)

_ARGUMENTS_HASH = re.compile(r"~[A-Za-z0-9_-]+$")
ALLOWED["http: a binding with arguments has a hashed properties key"] = Difference(
    reason="a binding's properties_key ends with a hash of its arguments: RabbitMQ's is "
    "erlang:phash2 of the Erlang term of the table, which streamq does not reproduce; "
    "clients read the key from the listing and pass it back, never compute it",
    mask=_each_record(
        _deep(lambda v: _ARGUMENTS_HASH.sub("~<hash>", v) if isinstance(v, str) else None)
    ),
)


def _empty_properties(value: object) -> object | None:
    if isinstance(value, dict) and value.get("properties") == []:
        return {**value, "properties": {}}
    return None


ALLOWED["http: get of a message without properties"] = Difference(
    reason="RabbitMQ renders a message's empty properties as [] (an empty Erlang proplist) "
    "and any other as an object; streamq always answers an object, one type to read",
    mask=_each_record(_deep(_empty_properties)),
    better=True,
)


def _get_status(request_is: Callable[[dict[str, object]], bool]) -> Mask:
    """Blanks the outcome of the POST .../get records whose request `request_is`."""

    def change(o: Observation) -> Observation:
        if o[1] == "get" and isinstance(o[2], dict) and request_is(o[2]):
            return (*o[:3], "<refused>")
        return o

    return _each_record(change)


ALLOWED["http: get with an unknown ackmode"] = Difference(
    reason="RabbitMQ fails with 500 (an internal error) on an unknown ackmode; streamq "
    "answers 400 naming the ackmodes it takes",
    mask=_get_status(lambda request: request.get("ackmode") == "nonsense"),
    better=True,
)
ALLOWED["http: get with a negative count"] = Difference(
    reason="RabbitMQ takes every message of the queue for a negative count (its loop counts "
    "down past zero), however many; streamq refuses it with 400, as it refuses more than "
    "10,000",
    mask=_get_status(lambda request: request.get("count") == -1),
    better=True,
)


def _list_arguments(o: Observation) -> Observation:
    if o[1] in ("PUT", "GET"):
        return (*o[:3], "<accepted or refused>")
    return o


ALLOWED["http: PUT an exchange with a list for arguments"] = Difference(
    reason="RabbitMQ declares an exchange whose arguments are a JSON list of strings (and "
    "refuses a list for a queue's); streamq refuses a list for both with 400",
    mask=_each_record(_list_arguments),
    better=True,
)


# Connections, channels and frames (tests/differential/scenarios/connection.py, channel.py,
# frames.py). Observations there are (connection, "method", channel, name, fields).


def _is_method(o: Observation, name: str, reply_code: int | None = None) -> bool:
    if len(o) < 5 or o[1] != "method" or o[3] != name:
        return False
    return reply_code is None or o[4].get("reply_code") == reply_code


def _until(stop: Callable[[Observation], bool]) -> Mask:
    """Drops the first observation `stop` accepts and all that follow: where a scenario
    ends in two different ways, only what came before is compared."""

    def mask(observations: list[Observation]) -> list[Observation]:
        for index, o in enumerate(observations):
            if stop(o):
                return observations[:index]
        return observations

    return mask


ALLOWED["channel: flow active=false"] = Difference(
    reason="streamq implements channel.flow active=false (the server stops deliveries on the "
    "channel until active=true, spec 1.5.2.3); RabbitMQ 3.10 refuses it with connection.close "
    "540 NOT_IMPLEMENTED - active=false. A client written for RabbitMQ never sends it",
    mask=_until(lambda o: _is_method(o, "channel.flow-ok") or _is_method(o, "connection.close")),
    better=True,
)
ALLOWED["frames: a body larger than its header announced"] = Difference(
    reason="RabbitMQ 3.10 waits for the rest of a body whose frames outgrew the content "
    "header's body-size (its remaining size goes negative) and never answers; streamq closes "
    "the connection with 501 FRAME_ERROR at once",
    mask=_until(
        lambda o: _is_method(o, "connection.close-ok") or _is_method(o, "connection.close", 501)
    ),
    better=True,
)
_DROPPED = Difference(
    reason="RabbitMQ 3.10's reader crashes on an unknown class or method id "
    "({unknown_method_id,...}) or an unknown field type in a table, and the socket drops "
    "without connection.close; streamq answers the spec's 540 NOT_IMPLEMENTED or 502 "
    "SYNTAX_ERROR with the method's ids (amqp_gateway/codec/method_frame.py)",
    mask=_until(lambda o: o[1:2] == ("socket closed",) or _is_method(o, "connection.close")),
    better=True,
)
for _name in (
    "frames: an unknown method id",
    "frames: an unknown class id",
    "frames: a field table with an unknown type tag",
):
    ALLOWED[_name] = _DROPPED


def _close_code_and_text(observations: list[Observation]) -> list[Observation]:
    """The reply code and text of connection.close, blanked (its ids are compared)."""
    return [
        (*o[:4], {**o[4], "reply_code": "<code>", "reply_text": "<text>"})
        if _is_method(o, "connection.close")
        else o
        for o in observations
    ]


_UNDECODABLE = Difference(
    reason="a method whose fields do not decode (truncated, trailing bytes, a table past its "
    "end) is 502 SYNTAX_ERROR, the spec's code for illegal field values, with what is wrong; "
    "RabbitMQ 3.10 says 501 FRAME_ERROR - cannot decode <<the octets>> "
    "(amqp_gateway/codec/method_frame.py keeps 501 for framing)",
    mask=_close_code_and_text,
)
for _name in (
    "frames: a truncated queue.declare",
    "frames: a queue.declare with trailing bytes",
    "frames: a field table longer than its method",
):
    ALLOWED[_name] = _UNDECODABLE


def _confirms_before_close(observations: list[Observation]) -> list[Observation]:
    """Drops the basic.acks read just before a channel.close on the same channel."""
    kept: list[Observation] = []
    for o in observations:
        closes = _is_method(o, "channel.close")
        while closes and kept and _is_method(kept[-1], "basic.ack") and kept[-1][2] == o[2]:
            kept.pop()
        kept.append(o)
    return kept


ALLOWED["confirm: a publish to a missing exchange closes the channel"] = Difference(
    reason="when a channel error closes a confirm channel, streamq first confirms what the "
    "channel stored before the error (after the sync that makes it durable), then closes it; "
    "RabbitMQ 3.10 closes at once and those confirms are lost, so clients republish "
    "messages that were stored (duplicates)",
    mask=_confirms_before_close,
    better=True,
)


ALLOWED["permissions: the same channel after its write is revoked"] = Difference(
    reason="streamq applies a revoked permission to the very next operation of every open "
    "connection (as LavinMQ 2.6, docs/users.md); RabbitMQ 3.10 caches up to 12 allowed "
    "answers per channel, so a channel that published before the revocation keeps "
    "publishing (a new channel is refused on both)",
    mask=_until(lambda o: o[:2] == ("record", "write revoked")),
    better=True,
)


_VHOST_GONE = re.compile(r"vhost '[^']*' is (deleted|down)")


def _vhost_gone_text(observations: list[Observation]) -> list[Observation]:
    """The text of connection.close for a deleted vhost, either wording, made one."""
    return [
        (*o[:4], {**o[4], "reply_text": _VHOST_GONE.sub("vhost <gone>", o[4]["reply_text"])})
        if _is_method(o, "connection.close")
        else o
        for o in observations
    ]


ALLOWED["vhosts: deleting a vhost closes its connections"] = Difference(
    reason="RabbitMQ 3.10 closes them with 320 and either \"vhost 'v' is deleted\" or, when "
    'its vhost supervisor stops first, "... is down": which one is a race on its side; '
    'streamq always says "is deleted" (both wordings are compared as one, the code too)',
    mask=_vhost_gone_text,
)


# Delivery traffic (traffic.py) redelivers all the time (its drain closes channels
# that hold unacked messages), and redeliveries carry x-delivery-count: the same
# difference for every scenario of scenarios/deliveries.py,
# and the one mask the random tests (test_random.py, test_random_deliveries.py) apply.
RANDOM_MASK: Mask = _without_delivery_count
for _name in (
    "deliveries: a burst of publishes to a limited queue goes to its consumer first",
    "deliveries: a cancelled consumer's deliveries stay unacked until settled",
    "deliveries: a close requeues over a drop-head max-length, the head is dead-lettered",
    "deliveries: a closed channel and a closed connection requeue what they held",
    "deliveries: a consumer is not passed over when there is nothing to deliver",
    "deliveries: a consumer out of credit rejoins the round robin at its end",
    "deliveries: a global prefetch at its limit holds no_ack consumers too",
    "deliveries: a global prefetch counts the gets unacked when it was set",
    "deliveries: a nack multiple requeues each get alone over a drop-head max-length",
    "deliveries: a nack multiple without requeue dead-letters gets before consumers",
    "deliveries: a recover requeues and delivers consumer by consumer",
    "deliveries: a reject with requeue over a drop-head max-length",
    "deliveries: acks single and multiple from gets and consumers",
    "deliveries: an ack multiple of a tag that is not unacked is a 406 that settles nothing",
    "deliveries: basic.qos global=false lifts the channel's global prefetch",
    "deliveries: global prefetch shared by two consumers of the channel",
    "deliveries: nack and reject without requeue dead-letter to a consumer of dead",
    "deliveries: nack multiple with requeue goes to the other connection's consumer in order",
    "deliveries: recover requeues gets and consumer deliveries to consumers with prefetch",
    "deliveries: wrong tags close the channel and requeue its deliveries",
):
    ALLOWED[_name] = _DELIVERY_COUNT


# Limits (tests/differential/scenarios/limits.py): records ("record", what, status).


def _missing_cleared(o: Observation) -> Observation:
    if str(o[1]).startswith("DELETE") and o[2] in (404, 500):
        return (*o[:2], "<404 or 500>")
    return o


ALLOWED["limits: clearing a limit of a missing vhost or user"] = Difference(
    reason="RabbitMQ 3.10 crashes with 500 clearing a limit of a vhost or user that does "
    "not exist (rabbit_vhost_limit:clear_limit/3 and clear_user_limits/3 fail); streamq "
    "answers 404",
    mask=_each_record(_missing_cleared),
    better=True,
)
