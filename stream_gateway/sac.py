"""Single active consumer: one subscription of a named group reads, the others wait.

Owns the groups (vhost, stream, name) of subscriptions made with
`single-active-consumer=true`, in the order they joined, and RabbitMQ's protocol for them:
the broker tells a subscription it became active or inactive with ConsumerUpdate, and the
newly active one answers with the offset specification it starts from (it may have
queried its stored offset meanwhile); nothing is delivered to it before that answer. On a
plain stream the first member is active; on a partition of a super stream (the
`super-stream` property) the member at the partition's index modulo the group's size is,
so that a super stream's partitions spread over its consumers. When the active member
leaves, the next one takes over. RabbitMQ waits for the old active member's answer before
activating the next; here the switch is immediate (the old one stops at once).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

from stream_gateway.codec import commands as c
from streamq.broker import stream_definitions
from streamq.broker.errors import NotFound

if TYPE_CHECKING:
    from stream_gateway.session import StreamSession
    from stream_gateway.subscriptions import Subscription

logger = logging.getLogger(__name__)

GroupKey = tuple[str, str, str]
UPDATES_PENDING_MAX: Final = 4096  # unanswered ConsumerUpdates per gateway


class SacGroups:
    """Every single-active-consumer group of a gateway."""

    def __init__(self) -> None:
        self.groups: dict[GroupKey, list[Subscription]] = {}
        self._updates: dict[tuple[int, int], Subscription] = {}  # (session id, correlation)

    def join(self, subscription: Subscription) -> None:
        assert subscription.group is not None
        members = self.groups.setdefault(subscription.group, [])
        members.append(subscription)
        self._rebalance(subscription.group, subscription)

    def leave(self, subscription: Subscription) -> None:
        group = subscription.group
        assert group is not None
        members = self.groups.get(group, [])
        if subscription in members:
            members.remove(subscription)
        if not members:
            self.groups.pop(group, None)
            return
        self._rebalance(group, None)

    def answered(self, session: StreamSession, correlation_id: int) -> Subscription | None:
        """The subscription whose ConsumerUpdate the client answered, if still there."""
        subscription = self._updates.pop((id(session), correlation_id), None)
        if (
            subscription is None
            or subscription.session.subscriptions.get(subscription.subscription_id)
            is not subscription
        ):
            return None
        return subscription

    def _rebalance(self, group: GroupKey, joined: Subscription | None) -> None:
        members = self.groups[group]
        active_index = self._active_index(members)
        for index, member in enumerate(members):
            active = index == active_index
            if active != member.active or member is joined:
                member.active = active
                member.awaiting_update = active
                self._notify(member, active)

    def _active_index(self, members: list[Subscription]) -> int:
        first = members[0]
        if not first.super_stream:
            return 0
        vhost = first.session.current_vhost()
        try:
            partitions = stream_definitions.partitions(vhost, first.super_stream)
        except NotFound:
            return 0
        if first.stream_name not in partitions:
            return 0
        return partitions.index(first.stream_name) % len(members)

    def _notify(self, member: Subscription, active: bool) -> None:
        s = member.session
        correlation_id = s.next_correlation_id()
        if len(self._updates) >= UPDATES_PENDING_MAX:
            self._updates.clear()  # answers that never came: forget them
        self._updates[(id(s), correlation_id)] = member
        s.send(c.ConsumerUpdate(correlation_id, member.subscription_id, active))
        s.flush()
