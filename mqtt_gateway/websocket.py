"""MQTT over WebSocket: one MQTT session over each socket the HTTP gateway upgrades.

Owns `MqttOverWebSocket`, what the HTTP gateway calls for each WebSocket upgraded to MQTT
(path `/mqtt`, subprotocol `mqtt`, as RabbitMQ's rabbitmq_web_mqtt and LavinMQ serve it;
the upgrade itself is http_gateway/websocket_api.py's): an `MqttSession` of the gateway,
the same session code as over TCP, run over the shared
`streamq.websocket_transport.WebSocketTransport`. Binary messages carry MQTT packets as a
byte stream (MQTT 5.0 section 6.0: a packet may span messages, a message may hold
several). It must not parse MQTT.

Limits as AMQP over WebSocket has them: the transport's inbox and write buffer marks,
and one incoming message of at most `message_bytes_max` (twice the maximum packet size:
the largest packet with others beside it; a packet over the maximum inside a message is
refused by the codec as over TCP, 5.0 with DISCONNECT 0x95). A socket whose upgrade came
from another site's page (`cross_origin`) is not local: guest's loopback-only rule
refuses it (docs/websocket.md, "Origins").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from mqtt_gateway.session import Endpoints, MqttSession
from streamq.websocket_transport import MessageSocket, WebSocketTransport

if TYPE_CHECKING:
    from mqtt_gateway.server import MqttGateway

MESSAGE_PACKETS_FACTOR: Final = 2  # one message: the largest packet and others beside it


def socket_endpoints(socket: MessageSocket) -> Endpoints | None:
    peer = socket.get_extra_info("peername")
    own = socket.get_extra_info("sockname")
    if isinstance(own, tuple) and isinstance(peer, tuple):
        return (str(peer[0]), int(peer[1]), str(own[0]), int(own[1]))
    return None


class MqttOverWebSocket:
    """What the HTTP gateway runs for each WebSocket upgraded to MQTT."""

    def __init__(self, gateway: MqttGateway, allowed_origins: frozenset[str] = frozenset()) -> None:
        self._gateway = gateway
        self.message_bytes_max = MESSAGE_PACKETS_FACTOR * gateway.packet_bytes_max
        self.allowed_origins = allowed_origins  # canonical (streamq.web_origin); empty: any

    async def serve(self, socket: MessageSocket) -> None:
        """Run one MQTT connection over `socket` until either side closes it."""
        session = MqttSession(self._gateway, socket_endpoints(socket))
        session.cross_origin = socket.cross_origin
        session.websocket = True
        await WebSocketTransport(socket, session).run()
