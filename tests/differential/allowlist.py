"""Known, deliberate differences from RabbitMQ 3.10: one entry per scenario, each with
the reason, and a mask that removes only what differs from both brokers' observations
before they are compared (the rest of the scenario is still compared).
docs/compatibility.md lists them for users."""

from __future__ import annotations

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
