"""How the management API reads booleans and integers, as RabbitMQ's management plugin does.

Owns the one reading of boolean and integer fields (of JSON bodies and query strings)
that every handler shares. RabbitMQ reads
a boolean with `rabbit_mgmt_util:parse_bool/1` (JSON true/false, or the strings "true"
and "false") and an integer with `parse_int/1` (a JSON number, or a decimal string with
an optional sign). rabbitmqadmin relies on both: it sends every `name=value` it does not
parse as JSON as a string (`"durable": "true"`, `"count": "1"`). Anything else is a 400
naming the field. This module reads values only; what a value means (defaults, ranges)
stays with the handler that asks. It does not touch `arguments`, policy definitions or
message properties, whose values RabbitMQ takes as typed JSON only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from http_gateway.errors import HttpError

BOOLEAN_TEXTS: Final = {"true": True, "false": False}  # exact, as parse_bool matches them
# Erlang's list_to_integer/1 takes a sign and ASCII digits, nothing else; Python's int()
# would also take spaces, "_" and other scripts' digits. Longer strings are no count or
# length any handler accepts, and are refused before being converted.
INTEGER_DIGITS_MAX: Final = 20
INTEGER_TEXT: Final = re.compile(rf"[+-]?[0-9]{{1,{INTEGER_DIGITS_MAX}}}")


def boolean(value: object) -> bool | None:
    """`value` read as a boolean: true, false, "true" or "false"; None if it is not one."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        return BOOLEAN_TEXTS.get(value)
    return None


def integer(value: object) -> int | None:
    """`value` read as an integer: a JSON integer, an integral JSON number (2.0) or a
    decimal string ("10", "+10", "-1"); None if it is not one. A bool is not an
    integer (JSON keeps them apart; Python's bool is an int). RabbitMQ truncates a
    fractional number (1.5 reads as 1); streamq refuses it, as it refuses "1.5"."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None  # is_integer: False for inf, nan
    if isinstance(value, str) and INTEGER_TEXT.fullmatch(value):
        return int(value)
    return None


def flag(body: Mapping[str, object], name: str, default: bool, *, where: str = "") -> bool:
    """`body[name]` read as a boolean, `default` when the key is absent. An explicit
    null is refused, as RabbitMQ refuses it. `where` ends the error's reason (" in
    {...}" for an entry of a definitions document). Raises HttpError 400."""
    if name not in body:
        return default
    found = boolean(body[name])
    if found is None:
        raise HttpError(400, f"{name} must be true or false{where}")
    return found


def bounded_integer(value: object, name: str, low: int, high: int | None = None) -> int:
    """`value` read as an integer from `low` to `high` (no upper bound when None).
    Raises HttpError 400 naming `name`."""
    found = integer(value)
    if found is None or found < low or (high is not None and found > high):
        if high is not None:
            wanted = f"an integer from {low} to {high}"
        elif low == 0:
            wanted = "a non-negative integer"
        else:
            wanted = f"an integer of at least {low}"
        raise HttpError(400, f"{name} must be {wanted}")
    return found


def query_flag(query: Mapping[str, str], name: str) -> bool:
    """A query-string switch such as `?if-unused=true`: true when it says "true" (in any
    case); absent or anything else is false."""
    return query.get(name, "false").lower() == "true"
