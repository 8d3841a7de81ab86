"""Direct connections: AMQP sessions of this broker for its own links, without a network.

Owns `DirectConnector`, what `Gateway.direct_connector()` returns: `open(user)` makes a
socketpair and attaches its server end to a normal `AmqpSession` (the gateway's protocol
factory, through `loop.connect_accepted_socket`), marked as direct for `user`. Such a
session logs in as that user whatever credentials its client sends
(amqp_gateway/access.py), as RabbitMQ's direct connections (`amqp://` with no host) do;
the user must exist and its vhost and resource permissions apply as on any connection.
Only sockets made here are marked: no network listener ever accepts a login without its
password. The management API lists these connections with type "direct" and peer
"direct". Nothing here parses AMQP.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
from typing import TYPE_CHECKING, Final

from amqp_gateway.endpoints import Endpoints

if TYPE_CHECKING:
    from amqp_gateway.gateway import Gateway

logger = logging.getLogger(__name__)

DIRECT_PEER_HOST: Final = "direct"


def direct_endpoints(number: int) -> Endpoints:
    """The `number`th direct connection: on this host, numbered apart by its peer port."""
    return Endpoints(DIRECT_PEER_HOST, number, DIRECT_PEER_HOST, 0, True)


class DirectConnector:
    """Opens direct connections to one gateway; call on the broker's event loop."""

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway
        self._numbers = itertools.count(1)
        self._attaching: set[asyncio.Task[object]] = set()

    def open(self, user: str) -> socket.socket:
        """The client end of a new direct connection whose session logs in as `user`.
        The session is attached on the next loop turn; bytes written before wait in the
        socket. Raises OSError when no socketpair can be made (out of descriptors)."""
        loop = asyncio.get_running_loop()
        self._gateway.attach(loop)
        client_end, server_end = socket.socketpair()
        session = self._gateway.protocol_factory(direct_endpoints(next(self._numbers)))
        session.direct_user = user
        task: asyncio.Task[object] = loop.create_task(
            loop.connect_accepted_socket(lambda: session, server_end)
        )
        self._attaching.add(task)
        task.add_done_callback(self._attached)
        return client_end

    def _attached(self, task: asyncio.Task[object]) -> None:
        self._attaching.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # The client end then sees its peer close: its link reports that and retries.
            logger.error("a direct connection could not start: %s", task.exception())
