"""The classic queue arguments of priority queues, delivery limits, consumer timeouts and
queue expiry: their validation in RabbitMQ's words, and the settings they give together
with a policy.

Owns `x-max-priority`, `x-delivery-limit`, `x-consumer-timeout` and `x-expires`. As
RabbitMQ (`rabbit_amqqueue:check_arguments`), a bad value is a 406 whose text ends with
the Erlang term RabbitMQ prints for the error, since clients and their tests match on it.
Where both an argument and a policy key set a limit, the smaller wins (RabbitMQ's
`res_min`); `x-max-priority` has no policy key, by RabbitMQ's design. It knows no AMQP
frames and holds no state.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from streamq.broker.equivalence import type_name
from streamq.broker.errors import PreconditionFailed
from streamq.queues.priority import PRIORITY_MAX

# RabbitMQ's consumer_timeout: a delivery unacked this long closes its channel (0: never).
CONSUMER_TIMEOUT_MS_DEFAULT: Final = 1_800_000


def _as_int(value: object) -> int | None:
    """The value if it is an AMQP integer of any width (bool is not one), else None."""
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    return None


def _problem(key: str, value: object) -> str | None:
    """RabbitMQ's error term for a bad value of `key`, None if the value is good."""
    number = _as_int(value)
    if number is None:
        return f'"expected integer, got {type_name(value)}"'
    if key == "x-expires" and number == 0:
        return "{value_zero,0}"
    if number < 0:
        return f"{{value_negative,{number}}}"
    if key == "x-max-priority" and number > PRIORITY_MAX:
        return f"{{max_value_exceeded,{number}}}"
    return None


def check_queue_arguments(name: str, vhost: str, arguments: Mapping[str, object]) -> None:
    """Raise PreconditionFailed for a bad `x-max-priority`, `x-delivery-limit`,
    `x-consumer-timeout` or `x-expires`."""
    for key in ("x-expires", "x-max-priority", "x-delivery-limit", "x-consumer-timeout"):
        if key not in arguments:
            continue
        problem = _problem(key, arguments[key])
        if problem is not None:
            raise PreconditionFailed(
                f"invalid arg '{key}' for queue '{name}' in vhost '{vhost}': {problem}"
            )


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
