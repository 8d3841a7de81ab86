"""Queue arguments: their validation on declare in RabbitMQ's words and order, and the
settings of priority queues, delivery limits, consumer timeouts and queue expiry together
with a policy.

As RabbitMQ 3.10 (`rabbit_channel`'s queue.declare and `rabbit_amqqueue:declare`), a new
queue's arguments are checked in this order, the first problem being a 406: the type of
`x-dead-letter-exchange`; `x-queue-type`; then each argument its queue type knows, in
`rabbit_amqqueue:declare_args()` order, whose text ends with the Erlang term RabbitMQ
prints for the error (clients and their tests match on it); last, the first argument in
the table that another queue type knows but this one does not. streamq adds
`x-delivery-limit` and `x-consumer-timeout` to classic queues (RabbitMQ 3.10 has the first
on quorum queues only, the second from 3.12). Streams' own rules are in `streams.py`.
Then, as RabbitMQ's queue types, a quorum queue or stream must be durable, and neither
exclusive nor auto-delete.
Where both an argument and a policy key set a limit, the smaller wins (RabbitMQ's
`res_min`); `x-max-priority` has no policy key, by RabbitMQ's design. It knows no AMQP
frames and holds no state.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

from streamq.broker.equivalence import type_name
from streamq.broker.errors import PreconditionFailed
from streamq.queues.priority import PRIORITY_MAX

# RabbitMQ's consumer_timeout: a delivery unacked this long closes its channel (0: never).
CONSUMER_TIMEOUT_MS_DEFAULT: Final = 1_800_000
CLASSIC: Final = "classic"
QUORUM: Final = "quorum"  # served as a classic queue: there is one node
STREAM: Final = "stream"
OVERFLOW_MODES: Final = ("drop-head", "reject-publish", "reject-publish-dlx")
QUEUE_MODES: Final = ("default", "lazy")
QUEUE_VERSIONS: Final = (1, 2)
DEAD_LETTER_STRATEGIES: Final = ("at-most-once", "at-least-once")
LEADER_LOCATORS: Final = ("client-local", "balanced")

# rabbit_queue_type:arguments(queue_arguments, Type) of each type, RabbitMQ 3.10.
_CLASSIC_ARGUMENTS: Final = frozenset(
    {
        "x-expires",
        "x-message-ttl",
        "x-dead-letter-exchange",
        "x-dead-letter-routing-key",
        "x-max-length",
        "x-max-length-bytes",
        "x-max-priority",
        "x-overflow",
        "x-queue-mode",
        "x-queue-version",
        "x-single-active-consumer",
        "x-queue-type",
        "x-queue-master-locator",
    }
)
_QUORUM_ARGUMENTS: Final = frozenset(
    {
        "x-dead-letter-exchange",
        "x-dead-letter-routing-key",
        "x-dead-letter-strategy",
        "x-expires",
        "x-max-length",
        "x-max-length-bytes",
        "x-max-in-memory-length",
        "x-max-in-memory-bytes",
        "x-overflow",
        "x-single-active-consumer",
        "x-queue-type",
        "x-quorum-initial-group-size",
        "x-delivery-limit",
        "x-message-ttl",
        "x-queue-leader-locator",
    }
)
_STREAM_ARGUMENTS: Final = frozenset(
    {
        "x-queue-type",
        "x-max-length-bytes",
        "x-max-age",
        "x-stream-max-segment-size-bytes",
        "x-initial-cluster-size",
        "x-queue-leader-locator",
    }
)
_STREAMQ_ADDED: Final = frozenset({"x-delivery-limit", "x-consumer-timeout"})
_KNOWN_BY_TYPE: Final = {
    CLASSIC: _CLASSIC_ARGUMENTS | _STREAMQ_ADDED,
    QUORUM: _QUORUM_ARGUMENTS | _STREAMQ_ADDED,
}
_KNOWN_BY_ANY: Final = _CLASSIC_ARGUMENTS | _QUORUM_ARGUMENTS | _STREAM_ARGUMENTS

Validator = Callable[[object, Mapping[str, object]], str | None]


def _as_int(value: object) -> int | None:
    """The value if it is an AMQP integer of any width (bool is not one), else None."""
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    return None


def _quoted(text: str) -> str:
    # RabbitMQ prints an error string with ~p: in double quotes.
    return f'"{text}"'


def _non_negative(value: object, _: Mapping[str, object]) -> str | None:
    number = _as_int(value)
    if number is None:
        return _quoted(f"expected integer, got {type_name(value)}")
    return f"{{value_negative,{number}}}" if number < 0 else None


def _positive(value: object, arguments: Mapping[str, object]) -> str | None:
    problem = _non_negative(value, arguments)
    return "{value_zero,0}" if problem is None and value == 0 else problem


def _max_priority(value: object, arguments: Mapping[str, object]) -> str | None:
    problem = _non_negative(value, arguments)
    if problem is None and (_as_int(value) or 0) > PRIORITY_MAX:
        return f"{{max_value_exceeded,{value}}}"
    return problem


def _queue_version(value: object, arguments: Mapping[str, object]) -> str | None:
    problem = _non_negative(value, arguments)
    if problem is None and value not in QUEUE_VERSIONS:
        return _quoted(f"unsupported queue version '{value}'")
    return problem


def _longstr(value: object) -> str | None:
    return None if isinstance(value, str) else f"{{unacceptable_type,{type_name(value)}}}"


def _one_of(choices: tuple[str, ...], refusal: Callable[[str], str]) -> Validator:
    def check(value: object, _: Mapping[str, object]) -> str | None:
        problem = _longstr(value)
        if problem is None and value not in choices:
            return refusal(str(value))
        return problem

    return check


def _dead_letter_routing_key(value: object, arguments: Mapping[str, object]) -> str | None:
    problem = _longstr(value)
    if problem is None and "x-dead-letter-exchange" not in arguments:
        return "routing_key_but_no_dlx_defined"
    return problem


def _boolean(value: object, _: Mapping[str, object]) -> str | None:
    return None if isinstance(value, bool) else f"{{unacceptable_type,{type_name(value)}}}"


# rabbit_amqqueue:declare_args(), in its order (RabbitMQ 3.10); then streamq's own.
_VALIDATORS: Final[tuple[tuple[str, Validator], ...]] = (
    ("x-expires", _positive),
    ("x-message-ttl", _non_negative),
    ("x-dead-letter-routing-key", _dead_letter_routing_key),
    ("x-max-length", _non_negative),
    ("x-max-length-bytes", _non_negative),
    ("x-max-in-memory-length", _non_negative),
    ("x-max-in-memory-bytes", _non_negative),
    ("x-max-priority", _max_priority),
    ("x-overflow", _one_of(OVERFLOW_MODES, lambda _: "invalid_overflow")),
    ("x-queue-mode", _one_of(QUEUE_MODES, lambda v: _quoted(f"unsupported queue mode '{v}'"))),
    ("x-queue-version", _queue_version),
    ("x-single-active-consumer", _boolean),
    ("x-quorum-initial-group-size", _positive),
    ("x-queue-leader-locator", _one_of(LEADER_LOCATORS, lambda _: "invalid_queue_locator_arg")),
    ("x-dead-letter-strategy", _one_of(DEAD_LETTER_STRATEGIES, lambda _: "invalid_dlx_strategy")),
    ("x-delivery-limit", _non_negative),
    ("x-consumer-timeout", _non_negative),
)


def check_queue_arguments(name: str, vhost: str, arguments: Mapping[str, object]) -> str:
    """The queue type of a new queue with these arguments. Raises PreconditionFailed
    for the first bad argument RabbitMQ would report; of a stream, only for the type of
    `x-dead-letter-exchange` and `x-queue-type` (`streams.py` checks the rest)."""
    where = f"queue '{name}' in vhost '{vhost}'"
    dead_letter_exchange = arguments.get("x-dead-letter-exchange")
    if dead_letter_exchange is not None and not isinstance(dead_letter_exchange, str):
        raise PreconditionFailed(
            f"invalid type '{type_name(dead_letter_exchange)}' for arg "
            f"'x-dead-letter-exchange' in {where}"
        )
    kind = arguments.get("x-queue-type", CLASSIC)
    problem = _longstr(kind)
    if problem is None and kind not in (CLASSIC, QUORUM, STREAM):
        problem = _quoted(f"unsupported queue type '{kind}'")
    if problem is not None:
        raise PreconditionFailed(f"invalid arg 'x-queue-type' for {where}: {problem}")
    assert isinstance(kind, str)
    if kind == STREAM:
        return kind
    known = _KNOWN_BY_TYPE[kind]
    for key, validator in _VALIDATORS:
        if key in known and key in arguments:
            problem = validator(arguments[key], arguments)
            if problem is not None:
                raise PreconditionFailed(f"invalid arg '{key}' for {where}: {problem}")
    for key in arguments:
        if key in _KNOWN_BY_ANY and key not in known:
            raise PreconditionFailed(
                f"invalid arg '{key}' for {where} of queue type rabbit_{kind}_queue"
            )
    return kind


def check_queue_properties(
    kind: str, name: str, vhost: str, durable: bool, exclusive: bool, auto_delete: bool
) -> None:
    """RabbitMQ's refusal (406), in its order, of a quorum queue or stream that is
    auto-delete, exclusive or not durable; a classic queue may be any of these."""
    if kind == CLASSIC:
        return
    for refused, prop in (
        (auto_delete, "auto-delete"),
        (exclusive, "exclusive-owner"),
        (not durable, "non-durable"),
    ):
        if refused:
            raise PreconditionFailed(
                f"invalid property '{prop}' for queue '{name}' in vhost '{vhost}'"
            )


def with_default_queue_type(
    arguments: Mapping[str, object],
    default_type: str | None,
    durable: bool,
    exclusive: bool,
    auto_delete: bool,
) -> Mapping[str, object]:
    """A new queue's arguments with its vhost's `default_queue_type` as `x-queue-type` when
    it names none, as RabbitMQ 3.10's `rabbit_amqqueue:augment_declare_args/5`: only where
    that type may have these properties (a quorum queue or stream is durable, neither
    exclusive nor auto-delete), else the queue stays classic."""
    if default_type is None or "x-queue-type" in arguments:
        return arguments
    if default_type != CLASSIC and (exclusive or auto_delete or not durable):
        return arguments
    return {**arguments, "x-queue-type": default_type}


def max_priority(arguments: Mapping[str, object]) -> int | None:
    """The queue's largest priority, None for a queue without priorities (no argument,
    or 0, which RabbitMQ accepts and which means one level only)."""
    value = _as_int(arguments.get("x-max-priority"))
    return value if value is not None and 0 < value <= PRIORITY_MAX else None


def smaller(
    arguments: Mapping[str, object], argument: str, policy: Mapping[str, object], key: str
) -> int | None:
    """The smaller of the argument and the policy key, ignoring values that are not
    non-negative integers; None when neither is set."""
    values = [
        v
        for v in (_as_int(arguments.get(argument)), _as_int(policy.get(key)))
        if v is not None and v >= 0
    ]
    return min(values) if values else None
