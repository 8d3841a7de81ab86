"""What the MQTT gateway publishes to the broker for the management API.

Owns `MqttClient`, the `streamq.broker.clients.Client` view of one MQTT connection, as
RabbitMQ's MQTT plugin lists it: protocol "MQTT 3.1.1" (or "MQTT 3.1", "MQTT 5.0"; over
WebSocket "Web MQTT 3.1.1"...), and
in `client_properties` the client id, clean session and keep-alive. Its consumers are
not channels, so it lists none. Nothing here runs per message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

from mqtt_gateway.codec import ProtocolLevel
from streamq.broker.clients import ChannelInfo
from streamq.tls_peer import transport_tls_fields

if TYPE_CHECKING:
    from mqtt_gateway.session import MqttSession

PROTOCOLS: Final = {
    ProtocolLevel.MQTT_3_1: "MQTT 3.1",
    ProtocolLevel.MQTT_3_1_1: "MQTT 3.1.1",
    ProtocolLevel.MQTT_5: "MQTT 5.0",
}


class MqttClient:
    """A registered MQTT connection: reads its session's state when asked."""

    def __init__(self, session: MqttSession) -> None:
        self._session = session
        ends = session.endpoints or ("?", 0, "?", 0)
        self.peer_host, self.peer_port, self.host, self.port = ends
        self.name = session.name
        self.connection_type = "network"
        # Over WebSocket "Web MQTT 3.1.1", as RabbitMQ's rabbitmq_web_mqtt names it.
        self.protocol = ("Web " if session.websocket else "") + PROTOCOLS[session.level]
        self.connected_at_ms = session.connected_at_ms
        self.tls = transport_tls_fields(session.transport)
        # CONNECT's user name and password, or "EXTERNAL": the TLS certificate's CN.
        self.auth_mechanism = session.auth_mechanism

    @property
    def vhost(self) -> str:
        vhost = self._session.vhost
        return vhost.name if vhost is not None else ""

    @property
    def user(self) -> str:
        return self._session.user

    @property
    def client_properties(self) -> Mapping[str, object]:
        connect = self._session.connect
        return {
            "client_id": self._session.client_id,
            "clean_session": connect.clean_start if connect is not None else True,
            "keepalive": connect.keep_alive_s if connect is not None else 0,
        }

    @property
    def frame_max(self) -> int:
        return self._session.gateway.packet_bytes_max

    @property
    def channel_max(self) -> int:
        return 0

    @property
    def heartbeat_s(self) -> int:
        connect = self._session.connect
        return connect.keep_alive_s if connect is not None else 0

    @property
    def recv_oct(self) -> int:
        return self._session.recv_oct

    @property
    def send_oct(self) -> int:
        return self._session.send_oct

    @property
    def blocked(self) -> bool:
        return False

    @property
    def state(self) -> str:
        return "running"

    def channels(self) -> list[ChannelInfo]:
        return []

    def close(self, reason: str) -> None:
        """The management API's close: 5.0 clients get DISCONNECT "administrative
        action" first, 3.x ones see the socket close (they have no DISCONNECT to read)."""
        self._session.close_by_admin(reason)

    def cancel_consumer(self, channel: int, tag: str) -> bool:
        return False
