"""Which client connections are open in each vhost and for each user, for the limits
(RabbitMQ's `rabbit_connection_tracking` and `rabbit_channel_tracking`).

Owns `ConnectionTracking`, on the broker: a gateway adds a connection once it is open in
its vhost and removes it when it closes, so the counts are O(1); a user's channels are
summed over its connections (`Tracked.open_channel_count`) only when a `max-channels`
limit is set. And the two checks RabbitMQ makes with them: at connection.open
(`open_refusal`: the vhost's `max-connections`, then the user's) and at channel.open
(`channel_refusal`: the user's `max-channels`). AMQP connections (direct ones of the
broker's own links included) and stream protocol connections are counted, as RabbitMQ
3.10 tracks both; the stream protocol is never refused by a limit (RabbitMQ 3.10's stream
reader does not check them). Lowering a limit closes nothing: it applies to the next open.

Call on the event loop (the gateways' thread); it does not know sockets or frames.
"""

from __future__ import annotations

from typing import Protocol

from streamq.broker import account_limits
from streamq.broker.account_limits import MAX_CHANNELS, MAX_CONNECTIONS
from streamq.broker.accounts import AccountStore


class Tracked(Protocol):
    """A connection a gateway tracks."""

    def open_channel_count(self) -> int:
        """Its channels open now (0 for a protocol without channels)."""


class ConnectionTracking:
    """Open connections by vhost and by user (see the module docstring)."""

    def __init__(self, accounts: AccountStore) -> None:
        self._accounts = accounts
        self._by_vhost: dict[str, set[Tracked]] = {}
        self._by_user: dict[str, set[Tracked]] = {}

    def add(self, connection: Tracked, vhost: str, user: str) -> None:
        self._by_vhost.setdefault(vhost, set()).add(connection)
        self._by_user.setdefault(user, set()).add(connection)

    def remove(self, connection: Tracked, vhost: str, user: str) -> None:
        """Forget `connection` (nothing to do if it was not added)."""
        for table, key in ((self._by_vhost, vhost), (self._by_user, user)):
            found = table.get(key)
            if found is not None:
                found.discard(connection)
                if not found:
                    del table[key]

    def count_in_vhost(self, vhost: str) -> int:
        return len(self._by_vhost.get(vhost, ()))

    def count_of_user(self, user: str) -> int:
        return len(self._by_user.get(user, ()))

    def channels_of_user(self, user: str) -> int:
        return sum(c.open_channel_count() for c in self._by_user.get(user, ()))

    def open_refusal(self, vhost: str, user: str) -> str | None:
        """RabbitMQ's 530 text refusing a connection.open of `user` in `vhost` at a
        vhost's or the user's max-connections (rabbit_reader checks them in this order),
        None to let it open."""
        limit = self._accounts.vhost_limit(vhost, MAX_CONNECTIONS)
        if limit is not None and self.count_in_vhost(vhost) >= limit:
            return account_limits.vhost_connections_refused(vhost, user, limit)
        limit = self._accounts.user_limit(user, MAX_CONNECTIONS)
        if limit is not None and self.count_of_user(user) >= limit:
            return account_limits.user_connections_refused(user, limit)
        return None

    def channel_refusal(self, user: str) -> str | None:
        """RabbitMQ's 530 text refusing a channel.open of `user` at its max-channels
        (counting the channels open on all its connections), None to let it open."""
        limit = self._accounts.user_limit(user, MAX_CHANNELS)
        if limit is not None and self.channels_of_user(user) >= limit:
            return account_limits.user_channels_refused(user, limit)
        return None
