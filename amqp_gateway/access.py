"""Login, open and permissions: who is on a connection, in which vhost, and what it may do.

Owns the server's side of the connection handshake: what connection.start says about the
server (`server_properties`), the login (PLAIN and AMQPLAIN by password, SASL EXTERNAL by
the client certificate, through amqp_gateway/external_auth.py), the vhost at
connection.open and the listing of the open connection in `Broker.clients`; and each
connection's cache of its resource and topic permission answers (`Permissions`). The functions take
the session they work for, as amqp_gateway/publishing.py's do. What the handshake methods
say on the wire, and when each comes, is the protocol's (amqp_gateway/handshake.py,
connection.py); no socket is touched here.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Final

from amqp_gateway import codec, errors
from amqp_gateway.client_view import AmqpClient
from amqp_gateway.errormap import to_amqp
from amqp_gateway.events import LoginRequested
from amqp_gateway.external_auth import authenticate_login, certificate_login
from amqp_gateway.handshake import SERVER_CAPABILITIES
from streamq import __version__
from streamq.broker.accounts import AccountStore, PermissionKind
from streamq.broker.broker import Broker
from streamq.broker.definitions_import import INTERNAL_USER
from streamq.broker.errors import BrokerError
from streamq.broker.node_names import this_node_name
from streamq.broker.topic_permissions import TopicKind, amqp_variables
from streamq.broker.users import login_allowed
from streamq.log_fields import CONNECTION, USER, VHOST

if TYPE_CHECKING:
    from amqp_gateway.session import AmqpSession

logger = logging.getLogger(__name__)

PERMIT_CACHE_ENTRIES_MAX: Final = 1024
# The entry of `Permissions._answers` that says whether the user has topic permissions in
# the vhost at all; topic answers are keyed ("topic-write" or "topic-read", exchange, key).
_HAS_TOPIC_GRANTS: Final = ("topic", "", "")
# Only exchanges of this type are checked (not a delayed one routing as topic: RabbitMQ
# looks at the exchange record's type).
TOPIC_TYPE: Final = "topic"


def server_properties(broker: Broker) -> codec.FieldTable:
    """connection.start's server properties (RabbitMQ's), and `node`: the name of the
    node that serves the connection (in a cluster the leader, also for a connection
    that a follower forwards), as the management API names it."""
    return {
        "product": "streamq",
        "version": __version__,
        "platform": "Python",
        "information": "A streaming-first AMQP 0-9-1 broker",
        "capabilities": dict(SERVER_CAPABILITIES),
        "node": this_node_name(broker),
    }


def login(s: AmqpSession, event: LoginRequested) -> None:
    """Accept the login of start-ok, or raise AccessRefused."""
    if s.direct_user == INTERNAL_USER:
        # The links of parameters that a boot-time definitions import set (RabbitMQ's
        # internal user): allowed everything, and only on a direct connection.
        s.conn.accept_login(INTERNAL_USER)
        s.user = INTERNAL_USER
        s.auth_mechanism = event.mechanism
        s.internal = True
        s.impersonator = True  # may forward any user-id, as everything else
        return
    if s.direct_user is not None:
        # A direct connection of this broker's own links: the user it was opened for,
        # whatever the client sent (amqp_gateway/direct.py); it must exist.
        user = s.broker.accounts.user(s.direct_user)
    else:
        event = certificate_login(event, s.transport)  # EXTERNAL: the certificate's CN
        user = authenticate_login(s.broker.accounts, event)
    loopback = s.endpoints is not None and s.endpoints.loopback
    if user is None or not login_allowed(user.name, loopback):
        logger.warning(
            "login refused for user %r from %s",
            event.username,
            s.peer,
            extra={**s.log.fields, USER: event.username},
        )
        # No method to blame, as RabbitMQ has it (rabbit_reader:auth_fail/5).
        raise errors.AccessRefused(
            f"Login was refused using authentication mechanism {event.mechanism}. "
            "For details see the broker logfile."
        )
    s.conn.accept_login(user.name)
    s.user = user.name
    s.log.fields[USER] = user.name
    s.auth_mechanism = event.mechanism
    s.impersonator = "impersonator" in user.tags  # may publish any user-id


def open_vhost(s: AmqpSession, virtual_host: str) -> None:
    """Open the connection in `virtual_host`, or raise NotFound or NotAllowed."""
    try:
        vhost = s.broker.vhost(virtual_host)
    except BrokerError as exc:
        raise to_amqp(exc, 10, 40) from exc
    # The vhost's and the user's connection limits come before its permissions, as
    # rabbit_reader checks them.
    refusal = s.broker.tracking.open_refusal(virtual_host, s.user)
    if refusal is not None:
        raise errors.NotAllowed(refusal, 10, 40)
    if not s.internal and not s.broker.accounts.vhost_access(s.user, virtual_host):
        raise errors.NotAllowed(
            f"access to vhost '{virtual_host}' refused for user '{s.user}'", 10, 40
        )
    s.vhost = vhost
    s.permissions = Permissions(s.broker.accounts, s.user, vhost.name, allow_all=s.internal)
    s.conn.accept_open(virtual_host)
    s.broker.tracking.add(s, vhost.name, s.user)
    # A partial, not a closure over the session: no reference cycle through the protocol.
    s.conn.channel_gate = functools.partial(s.broker.tracking.channel_refusal, s.user)
    _register(s)
    s.log.fields[VHOST] = vhost.name
    s.opened = True
    # As RabbitMQ's "accepting AMQP connection" and "user ... authenticated and granted
    # access to vhost" lines, in one; amqp_gateway/session.py logs its close.
    logger.info(
        "accepted AMQP connection %s: user '%s' granted access to vhost '%s'",
        s.log.fields.get(CONNECTION, s.peer),
        s.user,
        vhost.name,
        extra=s.log.fields,
    )


def check_topic_access(
    s: AmqpSession, kind: TopicKind, exchange_name: str, routing_key: str, ids: tuple[int, int]
) -> None:
    """RabbitMQ's topic permission check of a binding (rabbit_channel:binding_action):
    `kind` of `routing_key` through `exchange_name` if it exists and is of type topic;
    raises AccessRefused (403) otherwise."""
    vhost = s.vhost
    permissions = s.permissions
    assert vhost is not None and permissions is not None  # methods come once open
    exchange = vhost.exchanges.get(exchange_name)
    if exchange is not None and exchange.type == TOPIC_TYPE:
        permissions.check_topic(kind, exchange_name, routing_key, ids)


def _register(s: AmqpSession) -> None:
    """List the open connection in `Broker.clients` for the management API."""
    ends = s.endpoints
    if s.transport is None or ends is None:
        return  # neither an IP nor a unix socket
    s.client = AmqpClient(s, (ends.host, ends.port), (ends.peer_host, ends.peer_port))
    s.broker.clients[s.client.name] = s.client


class Permissions:
    """One connection's answers to RabbitMQ's resource and topic permission checks,
    cached per connection as RabbitMQ caches them per channel, and kept live as LavinMQ
    2.6 keeps them (its `clear_permissions_cache`): any change to the accounts
    (permissions, topic permissions, users, vhosts) bumps `AccountStore.generation`, and
    the next check that sees a new generation drops every cached answer first (`clear`),
    so a revoked permission refuses the next publish, consume, bind or declare of a
    connection already open. The cost on the publish path is one int compare. Every
    answer, topic ones and whether the user has topic permissions at all included, lives
    in `_answers`: clearing it forgets them all. What was allowed before stays done: a
    consumer whose read permission is revoked keeps consuming, as in RabbitMQ and LavinMQ.
    Deleting a user or a vhost closes its connections (the HTTP API does, as RabbitMQ)."""

    __slots__ = ("_accounts", "_allow_all", "_answers", "_generation", "_user", "_vhost")

    def __init__(
        self, accounts: AccountStore, user: str, vhost: str, *, allow_all: bool = False
    ) -> None:
        self._accounts = accounts
        self._user = user
        self._vhost = vhost
        self._allow_all = allow_all  # the internal user of direct connections
        self._answers: dict[tuple[str, str, str], bool] = {}  # PERMIT_CACHE_ENTRIES_MAX
        self._generation = accounts.generation

    def clear(self) -> None:
        """Drop every cached answer: the next checks ask the accounts again."""
        self._generation = self._accounts.generation  # read first: a later change clears again
        self._answers.clear()

    def check(self, kind: PermissionKind, resource: str, name: str, ids: tuple[int, int]) -> None:
        """Raises AccessRefused (403) unless the user's `kind` regex allows `name`."""
        if self._allow_all:
            return
        if self._generation != self._accounts.generation:
            self.clear()
        key = (kind, resource, name)
        allowed = self._answers.get(key)
        if allowed is None:
            allowed = self._remember(
                key, self._accounts.permitted(self._user, self._vhost, kind, name)
            )
        if not allowed:
            shown = name or "amq.default"
            raise errors.AccessRefused(
                f"access to {resource} '{shown}' in vhost '{self._vhost}' "
                f"refused for user '{self._user}'",
                *ids,
            )

    def check_topic(
        self, kind: TopicKind, exchange: str, routing_key: str, ids: tuple[int, int]
    ) -> None:
        """RabbitMQ's topic permissions (rabbit_channel:check_topic_authorisation): raises
        AccessRefused (403) unless the user's `kind` topic permission on the topic
        exchange `exchange` allows `routing_key`. The caller checks only topic exchanges.
        Without any topic permission of the user in the vhost, this is one dict lookup."""
        if self._allow_all:
            return
        if self._generation != self._accounts.generation:
            self.clear()
        answers = self._answers
        has_grants = answers.get(_HAS_TOPIC_GRANTS)
        if has_grants is None:
            has_grants = self._remember(
                _HAS_TOPIC_GRANTS, self._accounts.topic_grants(self._user, self._vhost) is not None
            )
        if not has_grants:
            return
        key = ("topic-" + kind, exchange, routing_key)
        allowed = answers.get(key)
        if allowed is None:
            allowed = self._remember(key, self._topic_permitted(kind, exchange, routing_key))
        if not allowed:
            # RabbitMQ 3.10's words: the kind is not named (rabbit_access_control).
            raise errors.AccessRefused(
                f"access to topic '{routing_key}' in exchange '{exchange}' in vhost "
                f"'{self._vhost}' refused for user '{self._user}'",
                *ids,
            )

    def _topic_permitted(self, kind: TopicKind, exchange: str, routing_key: str) -> bool:
        grants = self._accounts.topic_grants(self._user, self._vhost)
        if grants is None:
            return True
        variables = amqp_variables(self._user, self._vhost)
        return grants.permitted(exchange, kind, routing_key, variables)

    def _remember(self, key: tuple[str, str, str], allowed: bool) -> bool:
        if len(self._answers) >= PERMIT_CACHE_ENTRIES_MAX:
            self._answers.clear()
        self._answers[key] = allowed
        return allowed
