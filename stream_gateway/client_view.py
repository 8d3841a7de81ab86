"""What the stream gateway publishes to the broker for the management API.

Owns `StreamClient`, the `streamq.broker.clients.Client` view of one stream connection
(protocol "RabbitMQ Stream"; its publishers and subscriptions are not channels, so it
lists none) and its registration in `Broker.clients` once open. Nothing here runs per
message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from streamq.broker.clients import ChannelInfo
from streamq.tls_peer import transport_tls_fields

if TYPE_CHECKING:
    from stream_gateway.session import StreamSession

PROTOCOL = "RabbitMQ Stream"


class StreamClient:
    """A registered stream connection: reads its session's state when asked."""

    def __init__(self, session: StreamSession) -> None:
        self._session = session
        self.host, self.port = session.host, session.port
        self.peer_host, self.peer_port = session.peer_host, session.peer_port
        self.name = f"{self.peer_host}:{self.peer_port} -> {self.host}:{self.port}"
        self.connection_type = "network"
        self.protocol = PROTOCOL
        self.connected_at_ms = session.connected_at_ms
        self.tls = transport_tls_fields(session.transport)

    @property
    def vhost(self) -> str:
        vhost = self._session.vhost
        return vhost.name if vhost is not None else ""

    @property
    def user(self) -> str:
        return self._session.user

    @property
    def client_properties(self) -> Mapping[str, object]:
        return dict(self._session.client_properties)

    @property
    def frame_max(self) -> int:
        return self._session.frame_max

    @property
    def channel_max(self) -> int:
        return 0

    @property
    def heartbeat_s(self) -> int:
        return self._session.heartbeat_s

    @property
    def recv_oct(self) -> int:
        return self._session.recv_oct

    @property
    def send_oct(self) -> int:
        return self._session.send_oct

    @property
    def blocked(self) -> bool:
        return self._session.blocked

    @property
    def state(self) -> str:
        return "blocked" if self._session.blocked else "running"

    @property
    def auth_mechanism(self) -> str:
        return self._session.auth_mechanism

    def channels(self) -> list[ChannelInfo]:
        return []

    def close(self, reason: str) -> None:
        """The management API's close: the socket is closed without a Close frame, as
        RabbitMQ 3.10 does (`StreamSession.hang_up`)."""
        self._session.hang_up(reason)

    def cancel_consumer(self, channel: int, tag: str) -> bool:
        return False


def register(s: StreamSession) -> None:
    """List the open connection in `Broker.clients`."""
    if not s.peer_host:
        return
    client = StreamClient(s)
    s.broker.clients[client.name] = client
    s.registered = True


def unregister(s: StreamSession) -> None:
    if s.registered:
        s.registered = False
        name = f"{s.peer_host}:{s.peer_port} -> {s.host}:{s.port}"
        s.broker.clients.pop(name, None)
