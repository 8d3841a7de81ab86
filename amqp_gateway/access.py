"""Login, open and permissions: who is on a connection, in which vhost, and what it may do.

Owns the server's side of the connection handshake: what connection.start says about the
server (`server_properties`), the login (PLAIN and AMQPLAIN by password, SASL EXTERNAL by
the client certificate, through amqp_gateway/external_auth.py), the vhost at
connection.open and the listing of the open connection in `Broker.clients`; and each
connection's cache of its resource permission answers (`Permissions`). The functions take
the session they work for, as amqp_gateway/publishing.py's do. What the handshake methods
say on the wire, and when each comes, is the protocol's (amqp_gateway/handshake.py,
connection.py); no socket is touched here.
"""

from __future__ import annotations

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
from streamq.broker.definitions_import import INTERNAL_USER
from streamq.broker.errors import BrokerError
from streamq.broker.users import login_allowed

if TYPE_CHECKING:
    from amqp_gateway.session import AmqpSession

logger = logging.getLogger(__name__)

PERMIT_CACHE_ENTRIES_MAX: Final = 1024


def server_properties() -> codec.FieldTable:
    return {
        "product": "streamq",
        "version": __version__,
        "platform": "Python",
        "information": "A streaming-first AMQP 0-9-1 broker",
        "capabilities": dict(SERVER_CAPABILITIES),
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
        logger.warning("login refused for user %r from %s", event.username, s.peer)
        # No method to blame, as RabbitMQ has it (rabbit_reader:auth_fail/5).
        raise errors.AccessRefused(
            f"Login was refused using authentication mechanism {event.mechanism}. "
            "For details see the broker logfile."
        )
    s.conn.accept_login(user.name)
    s.user = user.name
    s.auth_mechanism = event.mechanism
    s.impersonator = "impersonator" in user.tags  # may publish any user-id


def open_vhost(s: AmqpSession, virtual_host: str) -> None:
    """Open the connection in `virtual_host`, or raise NotFound or NotAllowed."""
    try:
        vhost = s.broker.vhost(virtual_host)
    except BrokerError as exc:
        raise to_amqp(exc, 10, 40) from exc
    if not s.internal and not s.broker.accounts.vhost_access(s.user, virtual_host):
        raise errors.NotAllowed(
            f"access to vhost '{virtual_host}' refused for user '{s.user}'", 10, 40
        )
    s.vhost = vhost
    s.permissions = Permissions(s.broker.accounts, s.user, vhost.name, allow_all=s.internal)
    s.conn.accept_open(virtual_host)
    _register(s)


def _register(s: AmqpSession) -> None:
    """List the open connection in `Broker.clients` for the management API."""
    ends = s.endpoints
    if s.transport is None or ends is None:
        return  # neither an IP nor a unix socket
    s.client = AmqpClient(s, (ends.host, ends.port), (ends.peer_host, ends.peer_port))
    s.broker.clients[s.client.name] = s.client


class Permissions:
    """One connection's answers to RabbitMQ's resource permission checks, cached per
    connection as RabbitMQ caches them per channel, and kept live as LavinMQ 2.6 keeps
    them (its `clear_permissions_cache`): any change to the accounts (permissions, users,
    vhosts) bumps `AccountStore.generation`, and the next check that sees a new
    generation drops every cached answer first (`clear`), so a revoked permission refuses
    the next publish, consume or declare of a connection already open. The cost on the
    publish path is one int compare. What was allowed before stays done: a consumer whose
    read permission is revoked keeps consuming, as in RabbitMQ and LavinMQ. Deleting a
    user or a vhost closes its connections (the HTTP API does, as RabbitMQ)."""

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
            allowed = self._accounts.permitted(self._user, self._vhost, kind, name)
            if len(self._answers) >= PERMIT_CACHE_ENTRIES_MAX:
                self._answers.clear()
            self._answers[key] = allowed
        if not allowed:
            shown = name or "amq.default"
            raise errors.AccessRefused(
                f"access to {resource} '{shown}' in vhost '{self._vhost}' "
                f"refused for user '{self._user}'",
                *ids,
            )
