"""Durations in RabbitMQ's `x-max-age` syntax: a count and one unit, Y M D h m s.

Shared by retention (`x-max-age`, `max-age`) and stream consumers (an interval as
`x-stream-offset`). Pure; it imports nothing of the broker.
"""

from __future__ import annotations

import re
from typing import Final

AGE_PATTERN: Final = re.compile(r"^(\d+)([YMDhms])$")
UNIT_MS: Final = {
    "Y": 365 * 86_400_000,
    "M": 30 * 86_400_000,
    "D": 86_400_000,
    "h": 3_600_000,
    "m": 60_000,
    "s": 1_000,
}


def age_ms(text: object) -> int | None:
    """`30s`, `10m`, `1h`, `7D`, `1M`, `1Y` in milliseconds; None if it is not one."""
    match = AGE_PATTERN.match(text) if isinstance(text, str) else None
    if match is None:
        return None
    return int(match[1]) * UNIT_MS[match[2]]
