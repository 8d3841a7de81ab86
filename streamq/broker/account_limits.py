"""Vhost and user limits, as RabbitMQ 3.10 has them: their names, their validation in
RabbitMQ's words, and when a count is over one.

A vhost's limits are RabbitMQ's runtime parameter `vhost-limits`/`limits`
(`rabbit_vhost_limit`): `max-connections` and `max-queues`. A user's are its `limits` map
(`rabbit_auth_backend_internal`): `max-connections` and `max-channels`. Each value is an
integer; a negative one means "no limit" and is kept (and listed) as given; 0 allows
nothing. A vhost's parameter exists once set, even when its last limit is cleared (RabbitMQ
then lists it with the value `[]`); a user's map is simply empty.

Pure functions and values shared by the account store (streamq/broker/accounts.py), its
file (accounts_file.py), definitions imports and the gateways that enforce them; no state,
no I/O. The refusal texts are RabbitMQ's, formatted here so the AMQP and HTTP gateways
send the same words.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Final

from streamq.broker.account_values import AccountError
from streamq.broker.errors import PreconditionFailed

MAX_CONNECTIONS: Final = "max-connections"
MAX_QUEUES: Final = "max-queues"
MAX_CHANNELS: Final = "max-channels"
VHOST_LIMIT_NAMES: Final = (MAX_CONNECTIONS, MAX_QUEUES)  # rabbit_vhost_limit's validation
USER_LIMIT_NAMES: Final = (MAX_CONNECTIONS, MAX_CHANNELS)  # user_limit_validation/0
VHOST_COMPONENT: Final = "vhost-limits"  # the runtime parameter, by component and name
VHOST_PARAMETER: Final = "limits"
USER_COMPONENT: Final = "user-limits"  # the name RabbitMQ's user-limit errors give
CLEAR_ALL: Final = "all"  # clear_user_limits' name for every limit of a user
# A limit is a count, compared with counts of connections, channels or queues: a value
# beyond this is refused rather than stored (RabbitMQ takes any Erlang integer).
LIMIT_VALUE_MAX: Final = 2**63 - 1
ERLANG_TEXT_CHARS_MAX: Final = 200  # of a value quoted back in an error

Limits = Mapping[str, int]


class LimitInvalid(AccountError):
    """A limit that RabbitMQ's validation refuses; the message is RabbitMQ's."""


class QueueLimitReached(PreconditionFailed):
    """queue.declare of a new queue in a vhost at its max-queues (406, rabbit_channel)."""

    def __init__(self, queue: str, vhost: str, limit: int) -> None:
        super().__init__(
            f"cannot declare queue '{queue}': queue limit in vhost '{vhost}' ({limit}) is reached"
        )


def erlang_text(value: object) -> str:
    """`value`, decoded from JSON, as Erlang's `~p` prints what RabbitMQ decoded it to
    (strings are binaries, null an atom, objects maps), for RabbitMQ's error texts."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _erlang_float(value)
    if isinstance(value, str):
        return _erlang_binary(value)
    if isinstance(value, list):
        return "[" + ",".join(erlang_text(item) for item in value) + "]"
    if isinstance(value, dict):
        pairs = sorted(value.items())
        return "#{" + ",".join(f"{erlang_text(k)} => {erlang_text(v)}" for k, v in pairs) + "}"
    return repr(value)


def _erlang_float(value: float) -> str:
    text = repr(value)
    if "e" not in text:
        return text
    mantissa, exponent = text.split("e")
    if "." not in mantissa:
        mantissa += ".0"
    return f"{mantissa}e{int(exponent)}"


def _erlang_binary(text: str) -> str:
    if all(" " <= char <= "~" for char in text):
        return '<<"' + text.replace("\\", "\\\\").replace('"', '\\"') + '">>'
    if text.isprintable():
        return '<<"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"/utf8>>'
    octets = text.encode(errors="surrogatepass")  # a lone surrogate: its three octets
    return "<<" + ",".join(str(byte) for byte in octets) + ">>"


def validation_errors(component: str, names: tuple[str, ...], value: object) -> list[str]:
    """RabbitMQ's `rabbit_parameter_validation:proplist/3` errors for limits `value` of
    `component` ("limits" or "user-limits"), in its order; empty when valid."""
    if isinstance(value, list) and not value:
        return []  # an empty proplist, as RabbitMQ exports a vhost's cleared limits
    if not isinstance(value, dict):
        return [f"{component} not a list {erlang_text(value)}"[:ERLANG_TEXT_CHARS_MAX]]
    errors = []
    for name in names:
        if name in value:
            found = value[name]
            if type(found) is not int:
                shown = erlang_text(found)[:ERLANG_TEXT_CHARS_MAX]
                errors.append(f"{name} should be a number, actually was {shown}")
            elif abs(found) > LIMIT_VALUE_MAX:
                errors.append(f"{name} should be at most {LIMIT_VALUE_MAX}, actually was {found}")
    unknown = [(key, item) for key, item in sorted(value.items()) if key not in names]
    if unknown:
        terms = ",".join(f"{{{erlang_text(k)},{erlang_text(v)}}}" for k, v in unknown)
        errors.insert(0, f"Unrecognised terms [{terms}] in {component}"[:ERLANG_TEXT_CHARS_MAX])
    return errors


def check_vhost_limits(value: object) -> dict[str, int]:
    """A vhost's limits from `value` (an object, or [] for none); raises LimitInvalid
    with RabbitMQ's "Validation failed" text (rabbit_runtime_parameters:format_error/1)."""
    errors = validation_errors(VHOST_PARAMETER, VHOST_LIMIT_NAMES, value)
    if errors:
        raise LimitInvalid("Validation failed\n\n" + "".join(f"{e}\n" for e in errors))
    return dict(value) if isinstance(value, dict) else {}


def check_user_limits(value: object) -> dict[str, int]:
    """A user's limits from `value`; raises LimitInvalid with RabbitMQ's text (the first
    error only, as `validate_parameters_and_update_limit` reports it)."""
    errors = validation_errors(USER_COMPONENT, USER_LIMIT_NAMES, value)
    if errors:
        raise LimitInvalid(errors[0])
    return dict(value) if isinstance(value, dict) else {}


def without_limit(limits: Limits, name: str) -> dict[str, int]:
    """`limits` without `name`."""
    return {k: v for k, v in limits.items() if k != name}


def limit_of(limits: Limits | None, name: str) -> int | None:
    """The limit `name` in force: None when unset or negative (no limit)."""
    if limits is None:
        return None
    found = limits.get(name)
    return found if found is not None and found >= 0 else None


def vhost_connections_refused(vhost: str, user: str, limit: int) -> str:
    """connection.open over a vhost's max-connections (rabbit_reader, 530)."""
    return (
        f"access to vhost '{vhost}' refused for user '{user}': "
        f"connection limit ({limit}) is reached"
    )


def user_connections_refused(user: str, limit: int) -> str:
    """connection.open over a user's max-connections (rabbit_reader, 530)."""
    return f"connection refused for user '{user}': user connection limit ({limit}) is reached"


def user_channels_refused(user: str, limit: int) -> str:
    """channel.open over a user's max-channels (rabbit_reader:create_channel/2, 530)."""
    return (
        f"number of channels opened for user '{user}' has reached the maximum allowed user "
        f"limit of ({limit})"
    )


def queues_would_exceed(vhost: str, added: int, limit: int, count: int) -> str:
    """A definitions import adding more queues than a vhost's max-queues allows
    (rabbit_definitions:validate_vhost_queue_limit/3)."""
    return (
        f'Adding {added} queue(s) to virtual host "{vhost}" would exceed the limit of '
        f"{limit} queue(s).\n\nThis virtual host currently has {count} queue(s) defined.\n\n"
        "Import aborted!"
    )
