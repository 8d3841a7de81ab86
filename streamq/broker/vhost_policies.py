"""A vhost's policies: setting, clearing and applying them to its queues and exchanges.

Owns the vhost's policies and operator policies (`policies.py` makes and matches them),
records their changes in the definitions journal and replays them from it, and gives
every queue and exchange its effective policy at once (streams apply their retention
right away). It reads the vhost's registry (the `Entities` dicts of queues and
exchanges, given to it) and writes only the policy fields of what is in it. A queue
that stops dead-lettering at least once drops what it held through `drop_dead_letters`,
which the vhost wires in (dead letters are a component above this one).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from retention.rules import rules_from_arguments, rules_from_policy
from streamq.broker.deadletter import at_least_once, dead_letter_target, length_limits, ttl_of
from streamq.broker.definitions import DefinitionsJournal, Op
from streamq.broker.errors import NotFound
from streamq.broker.exchange import Exchange
from streamq.broker.policies import (
    POLICIES_PER_VHOST_MAX,
    Policy,
    PolicyInvalid,
    choose,
    effective,
    make_policy,
    policy_from_op,
    policy_op,
)
from streamq.broker.queue import Queue

logger = logging.getLogger(__name__)


class PolicySet:
    """The policies and operator policies of one vhost."""

    __slots__ = (
        "definitions",
        "drop_dead_letters",
        "exchanges",
        "name",
        "operator_policies",
        "policies",
        "queues",
    )

    def __init__(self, name: str, definitions: DefinitionsJournal) -> None:
        self.name = name
        self.definitions = definitions
        # The registry's (`Entities`), read only: the vhost hands them over once they
        # exist (a new entity gets its policy from here, so they come after this).
        self.queues: Mapping[str, Queue] = {}
        self.exchanges: Mapping[str, Exchange] = {}
        self.policies: dict[str, Policy] = {}
        self.operator_policies: dict[str, Policy] = {}
        self.drop_dead_letters: Callable[[Queue], None] = _keep_dead_letters

    def _policy_table(self, operator: bool) -> dict[str, Policy]:
        return self.operator_policies if operator else self.policies

    def set_policy(self, name: str, body: Mapping[str, object], *, operator: bool) -> Policy:
        """Add or replace a policy and apply it at once. Buffered: durable after the next
        sync round with companions (`sync_all`). Raises PolicyInvalid."""
        policy = make_policy(name, body, operator=operator)
        table = self._policy_table(operator)
        if name not in table and len(table) >= POLICIES_PER_VHOST_MAX:
            raise PolicyInvalid(f"a vhost holds at most {POLICIES_PER_VHOST_MAX} policies")
        table[name] = policy
        self.definitions.record(policy_op(policy, operator=operator))
        self.apply_policies()
        return policy

    def clear_policy(self, name: str, *, operator: bool) -> None:
        """Remove a policy and apply the change at once. Raises NotFound."""
        table = self._policy_table(operator)
        if table.pop(name, None) is None:
            raise NotFound("operator policy" if operator else "policy", name, self.name)
        kind = "operator_policy.delete" if operator else "policy.delete"
        self.definitions.record({"op": kind, "name": name})
        self.apply_policies()

    def apply_policies(self) -> None:
        """Give every queue and exchange its effective policy; streams apply their
        retention at once (a policy change takes effect on existing queues)."""
        for queue in self.queues.values():
            self.apply_policy(queue)
        for exchange in self.exchanges.values():
            exchange.policy = self.exchange_policy(exchange.name)

    def exchange_policy(self, name: str) -> dict[str, object]:
        """The definition in force for exchange `name` (see `policies.effective`)."""
        return effective(
            choose(self.policies, "exchange", name, ""),
            choose(self.operator_policies, "exchange", name, ""),
        )

    def apply_policy(self, queue: Queue) -> None:
        """Give `queue` its effective policy and what follows from it (TTL, limits,
        dead-lettering; a stream's retention, applied at once)."""
        queue_type = str(queue.arguments.get("x-queue-type", "classic"))
        queue.policy = effective(
            choose(self.policies, "queue", queue.name, queue_type),
            choose(self.operator_policies, "queue", queue.name, queue_type),
        )
        queue.message_ttl_ms = ttl_of(queue.arguments, queue.policy)
        if queue.stream is None:
            queue.max_length, queue.max_length_bytes, queue.overflow = length_limits(
                queue.arguments, queue.policy
            )
        queue.dead_letter_exchange, queue.dead_letter_routing_key = dead_letter_target(
            queue.arguments, queue.policy
        )
        queue.at_least_once = at_least_once(queue.arguments, queue.policy, queue.overflow)
        if not queue.at_least_once and queue.cursor.dead:
            # As RabbitMQ: a queue that leaves at-least-once drops what it held.
            self.drop_dead_letters(queue)
        if queue.stream is not None:
            rules = rules_from_arguments(queue.arguments).stricter(rules_from_policy(queue.policy))
            queue.stream.retention = rules
            queue.stream.apply_retention(int(time.time() * 1000), force=True)

    def restore(self, op: Op) -> None:
        """Replay one definitions record of a policy (start-up only)."""
        kind = op["op"]
        name = str(op.get("name", ""))
        if kind in ("policy", "operator_policy"):
            try:
                policy = policy_from_op(op)
            except PolicyInvalid as exc:
                logger.error("vhost %s: policy %r not restored: %s", self.name, name, exc)
                return
            self._policy_table(kind == "operator_policy")[name] = policy
        else:
            self._policy_table(kind == "operator_policy.delete").pop(name, None)

    def ops(self) -> list[Op]:
        """The definitions records that recreate every policy as it is now."""
        ops = [policy_op(p, operator=False) for p in self.policies.values()]
        ops += [policy_op(p, operator=True) for p in self.operator_policies.values()]
        return ops


def _keep_dead_letters(queue: Queue) -> None:
    raise AssertionError("the vhost wires this in before applying a policy")
