"""A vhost's policies: setting, clearing and applying them to its queues and exchanges.

Owns the part of `VHost` that keeps the vhost's policies and operator policies, records
their changes in the definitions journal, and gives every queue and exchange its
effective policy at once (streams apply their retention right away). `VHost` mixes it in.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from retention.rules import rules_from_arguments, rules_from_policy
from streamq.broker.dead_letters import DeadLetters
from streamq.broker.deadletter import at_least_once, dead_letter_target, length_limits, ttl_of
from streamq.broker.definitions import DefinitionsJournal
from streamq.broker.errors import NotFound
from streamq.broker.exchange import Exchange
from streamq.broker.policies import (
    POLICIES_PER_VHOST_MAX,
    Policy,
    PolicyInvalid,
    choose,
    effective,
    make_policy,
    policy_op,
)
from streamq.broker.queue import Queue


class VHostPolicies:
    """Mixed into `VHost`; the attributes below are the vhost's."""

    name: str
    exchanges: dict[str, Exchange]
    queues: dict[str, Queue]
    definitions: DefinitionsJournal
    policies: dict[str, Policy]
    operator_policies: dict[str, Policy]
    dead_letters: DeadLetters

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
            self._apply_policy(queue)
        for exchange in self.exchanges.values():
            exchange.policy = effective(
                choose(self.policies, "exchange", exchange.name, ""),
                choose(self.operator_policies, "exchange", exchange.name, ""),
            )

    def _apply_policy(self, queue: Queue) -> None:
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
            self.dead_letters.drop(queue)
        if queue.stream is not None:
            rules = rules_from_arguments(queue.arguments).stricter(rules_from_policy(queue.policy))
            queue.stream.retention = rules
            queue.stream.apply_retention(int(time.time() * 1000), force=True)
