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
