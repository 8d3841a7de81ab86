"""Policies: RabbitMQ's model of settings applied to queues and exchanges by name pattern.

Owns the validation of policies and operator policies of one vhost and the choice of the
one that applies to an entity: among the policies whose `pattern` (a regex, searched in
the name as RabbitMQ does) matches and whose `apply-to` covers the entity, the highest
`priority` wins (ties: the name that sorts first). Operator policies work the same way
and cap the numeric keys of the effective definition (the smaller value wins). It knows
no storage and no AMQP: the vhost persists policies and applies the result.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from streamq.broker.errors import BrokerError
from streamq.durations import age_ms

APPLY_TO: Final = ("all", "queues", "exchanges", "classic_queues", "streams")
# Keys and the type of their values; keys that belong to later features are accepted and
# stored, and take effect when those features land.
INTEGER_KEYS: Final = frozenset(
    {
        "max-length",
        "max-length-bytes",
        "message-ttl",
        "expires",
        "delivery-limit",
        "consumer-timeout",
    }
)
# The federation runtime reads the federation keys from exchanges' and queues' effective
# policies: the upstream (parameter name), the upstream set ("all": every upstream) or,
# RabbitMQ 3.10's, a regex of upstream names; one of them per policy.
FEDERATION_KEYS: Final = frozenset(
    {"federation-upstream", "federation-upstream-set", "federation-upstream-pattern"}
)
STRING_KEYS: Final = (
    frozenset(
        {
            "max-age",
            "overflow",
            "dead-letter-exchange",
            "dead-letter-routing-key",
            "dead-letter-strategy",
            "alternate-exchange",
        }
    )
    | FEDERATION_KEYS
)
BOOLEAN_KEYS: Final = frozenset({"delayed-message"})  # LavinMQ's: delay like x-delayed-exchange
OPERATOR_KEYS: Final = frozenset(
    {"max-length", "max-length-bytes", "message-ttl", "expires", "delivery-limit"}
)
OVERFLOW_VALUES: Final = ("drop-head", "reject-publish", "reject-publish-dlx")
DEAD_LETTER_STRATEGIES: Final = ("at-most-once", "at-least-once")
NAME_BYTES_MAX: Final = 255
POLICIES_PER_VHOST_MAX: Final = 10_000


class PolicyInvalid(BrokerError):
    """A policy that cannot be stored; the message says which field and why."""


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    pattern: str
    apply_to: str
    priority: int
    definition: Mapping[str, object]
    compiled: re.Pattern[str] = field(compare=False, repr=False)

    def applies(self, kind: str, name: str, queue_type: str) -> bool:
        """Whether the policy covers this entity: kind "queue" or "exchange"."""
        target = self.apply_to
        if target == "exchanges" and kind != "exchange":
            return False
        if target in ("queues", "classic_queues", "streams") and kind != "queue":
            return False
        if target == "classic_queues" and queue_type == "stream":
            return False
        if target == "streams" and queue_type != "stream":
            return False
        return self.compiled.search(name) is not None

    def to_json(self, vhost: str) -> dict[str, object]:
        """The policy as RabbitMQ's management API shows it."""
        return {
            "vhost": vhost,
            "name": self.name,
            "pattern": self.pattern,
            "apply-to": self.apply_to,
            "definition": dict(self.definition),
            "priority": self.priority,
        }


def make_policy(name: str, body: Mapping[str, object], *, operator: bool = False) -> Policy:
    """Validate a policy as the management API receives it (`pattern`, `definition`,
    optional `priority` and `apply-to`). Raises PolicyInvalid."""
    if not name or len(name.encode()) > NAME_BYTES_MAX:
        raise PolicyInvalid("a policy name is 1 to 255 bytes")
    pattern = body.get("pattern")
    if not isinstance(pattern, str):
        raise PolicyInvalid("'pattern' must be a string (a regular expression)")
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise PolicyInvalid(f"'pattern' is not a valid regular expression: {exc}") from None
    apply_to = body.get("apply-to", "all")
    if apply_to not in APPLY_TO:
        raise PolicyInvalid(f"'apply-to' must be one of {', '.join(APPLY_TO)}")
    priority = body.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise PolicyInvalid("'priority' must be an integer")
    definition = body.get("definition")
    if not isinstance(definition, dict) or not definition:
        raise PolicyInvalid("'definition' must be a non-empty object")
    allowed = OPERATOR_KEYS if operator else INTEGER_KEYS | STRING_KEYS | BOOLEAN_KEYS
    for key, value in definition.items():
        _check_key(key, value, allowed)
    if len(FEDERATION_KEYS & definition.keys()) > 1:
        raise PolicyInvalid(  # RabbitMQ's words
            "cannot specify federation-upstream, federation-upstream-set or "
            "federation-upstream-pattern together"
        )
    return Policy(name, pattern, str(apply_to), priority, dict(definition), compiled)


def _check_key(key: object, value: object, allowed: frozenset[str]) -> None:
    if key not in allowed:
        raise PolicyInvalid(f"unknown or unsupported policy key {key!r}")
    if key in INTEGER_KEYS:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise PolicyInvalid(f"{key!r} must be a non-negative integer")
        if key == "expires" and value == 0:
            raise PolicyInvalid("'expires' must be at least 1 (ms), as RabbitMQ")
    elif key in BOOLEAN_KEYS:
        if not isinstance(value, bool):
            raise PolicyInvalid(f"{key!r} must be a boolean")
    elif not isinstance(value, str):
        raise PolicyInvalid(f"{key!r} must be a string")
    elif key == "max-age" and age_ms(value) is None:
        raise PolicyInvalid(f"'max-age' must match ^\\d+[YMDhms]$, got {value!r}")
    elif key == "federation-upstream-pattern" and not _compiles(value):
        raise PolicyInvalid(f"'federation-upstream-pattern' is not a regular expression: {value!r}")
    elif key == "overflow" and value not in OVERFLOW_VALUES:
        raise PolicyInvalid(f"'overflow' must be one of {', '.join(OVERFLOW_VALUES)}")
    elif key == "dead-letter-strategy" and value not in DEAD_LETTER_STRATEGIES:
        # rabbit_policies:validate_policy0's words.
        raise PolicyInvalid(f'<<"{value}">> is not a valid dead letter strategy')


def _compiles(pattern: str) -> bool:
    try:
        re.compile(pattern)
    except re.error:
        return False
    return True


def policy_from_op(op: Mapping[str, object]) -> Policy:
    """A policy from a definitions record (validated again: the file may be old)."""
    return make_policy(
        str(op.get("name", "")),
        {
            "pattern": op.get("pattern"),
            "apply-to": op.get("apply-to", "all"),
            "priority": op.get("priority", 0),
            "definition": op.get("definition"),
        },
        operator=op.get("op") == "operator_policy",
    )


def policy_op(policy: Policy, *, operator: bool) -> dict[str, object]:
    return {
        "op": "operator_policy" if operator else "policy",
        "name": policy.name,
        "pattern": policy.pattern,
        "apply-to": policy.apply_to,
        "priority": policy.priority,
        "definition": dict(policy.definition),
    }


def choose(policies: Mapping[str, Policy], kind: str, name: str, queue_type: str) -> Policy | None:
    """The policy that applies: the highest priority among those that match."""
    best: Policy | None = None
    for policy in policies.values():
        if not policy.applies(kind, name, queue_type):
            continue
        if best is None or (policy.priority, best.name) > (best.priority, policy.name):
            best = policy
    return best


def effective(policy: Policy | None, operator: Policy | None) -> dict[str, object]:
    """The definition in force: the policy's keys, numeric ones capped by the operator
    policy's (the smaller wins); operator keys the policy lacks apply as they are."""
    result: dict[str, object] = dict(policy.definition) if policy is not None else {}
    if operator is not None:
        for key, cap in operator.definition.items():
            current = result.get(key)
            if isinstance(current, int) and isinstance(cap, int):
                result[key] = min(current, cap)
            else:
                result[key] = cap
    return result
