"""The MQTT side of a broker: what all its MQTT connections share, and its listeners.

Owns the `MqttGateway`: its sessions, the registry of connected client ids per vhost
(a new connection with a client id already connected takes the session over and closes
the old connection, MQTT-3.1.4-3), each vhost's retained messages (`RetainedStore`,
opened on first use, written behind the publishes that change them), the settings all
sessions read (`max_inflight_messages`, `default_vhost`, the maximum packet size,
`ssl_cert_login`), the
listing of connections in `Broker.clients`, and opening the TCP and unix socket
listeners. Deliveries are driven by the broker core's drain, which the AMQP gateway runs
for every vhost (as for the stream gateway). It must not parse packets (session.py and
the codec do).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from typing import Final

from mqtt_gateway import broker_side
from mqtt_gateway.binding_index import BindingIndex
from mqtt_gateway.client_view import MqttClient
from mqtt_gateway.codec import PACKET_BYTES_MAX_DEFAULT, ReasonCode
from mqtt_gateway.consumer import MqttConsumer
from mqtt_gateway.proxy import MqttStarter, socket_endpoints
from mqtt_gateway.pubrel_store import PubrelStore
from mqtt_gateway.qos2_store import Qos2Store
from mqtt_gateway.retained import RetainedStore
from mqtt_gateway.session import Endpoints, MqttSession
from streamq.broker.broker import Broker
from streamq.broker.queue import Queue
from streamq.broker.vhost import VHost
from streamq.proxy_receiver import ProxyHeaderReceiver, TrustedProxy, protocol_factory
from streamq.unix_socket import UnixListener, listen_unix

logger = logging.getLogger(__name__)

MQTT_PORT_DEFAULT: Final = 1883
# Resource alarms (streamq.broker.resources) are looked at this often; while one lasts,
# connections that publish are not read (as RabbitMQ blocks MQTT publishers), and the
# others go on, so that subscribers can drain what fills memory.
ALARM_CHECK_INTERVAL_S: Final = 0.2
MAX_INFLIGHT_MESSAGES_DEFAULT: Final = 65535  # LavinMQ's default
TOPIC_ALIAS_MAXIMUM_DEFAULT: Final = 16  # RabbitMQ's mqtt.topic_alias_maximum


class MqttGateway:
    """The MQTT side of a broker."""

    def __init__(
        self,
        broker: Broker,
        *,
        max_inflight_messages: int = MAX_INFLIGHT_MESSAGES_DEFAULT,
        default_vhost: str = "/",
        packet_bytes_max: int = PACKET_BYTES_MAX_DEFAULT,
        topic_alias_maximum: int = TOPIC_ALIAS_MAXIMUM_DEFAULT,
        ssl_cert_login: bool = False,
    ) -> None:
        self.broker = broker
        self.max_inflight_messages = max_inflight_messages
        self.default_vhost = default_vhost
        self.packet_bytes_max = packet_bytes_max
        self.topic_alias_maximum = topic_alias_maximum  # 5.0 clients' aliases, CONNACK's
        # RabbitMQ's mqtt.ssl_cert_login: a CONNECT without credentials over TLS with a
        # verified client certificate logs in as the certificate's CN.
        self.ssl_cert_login = ssl_cert_login
        self.sessions: set[MqttSession] = set()
        self.connected: dict[tuple[str, str], MqttSession] = {}  # (vhost, client id)
        self._retained: dict[str, RetainedStore] = {}
        self._qos2: dict[str, Qos2Store] = {}
        self._pubrel: dict[str, PubrelStore] = {}
        self._bindings: dict[str, BindingIndex] = {}
        self._wills: dict[tuple[str, str], asyncio.TimerHandle] = {}  # (vhost, client id)
        self._retained_flushing: set[asyncio.Task[None]] = set()
        self.alarm = ""  # a resource alarm's reason while publishers are blocked
        self._alarm_timer: asyncio.TimerHandle | None = None

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start watching the resource alarms (once, whichever listener opens first)."""
        if self._alarm_timer is None:
            self._alarm_timer = loop.call_later(ALARM_CHECK_INTERVAL_S, self._check_alarm)

    def protocol_factory(self) -> MqttSession:
        return MqttSession(self, None)

    def _check_alarm(self) -> None:
        loop = asyncio.get_running_loop()
        self._alarm_timer = loop.call_later(ALARM_CHECK_INTERVAL_S, self._check_alarm)
        if not self.sessions:
            return
        broker = self.broker
        reason = broker.resources.check(log_out_of_space=bool(broker.syncer.out_of_space))
        if reason == self.alarm:
            return
        self.alarm = reason
        if reason:
            logger.warning("resource alarm: %s; blocking MQTT publishers", reason)
        else:
            logger.warning("resource alarm cleared; unblocking MQTT publishers")
        for s in list(self.sessions):
            s.gate.hold_for_alarm(bool(reason) and s.published)

    # -- client ids ------------------------------------------------------------------------

    def take_over(self, s: MqttSession) -> None:
        """`s` logged in with its client id: a connection with the same one ends first,
        its session released before `s` resumes it (MQTT-3.1.4-3)."""
        assert s.vhost is not None
        key = (s.vhost.name, s.client_id)
        old = self.connected.get(key)
        if old is not None and old is not s:
            logger.info(
                "MQTT client id '%s' connected again from %s: closing %s",
                s.client_id,
                s.peer,
                old.peer,
            )
            old.disconnect(ReasonCode.SESSION_TAKEN_OVER)
            # Released now, not when its socket is gone: the new connection consumes
            # from the same queues at once.
            broker_side.release(old)
            old.vhost = None  # released: connection_lost has nothing left to do
        self.connected[key] = s
        will = self._wills.pop(key, None)
        if will is not None:
            will.cancel()  # MQTT-3.1.3-9: the session came back before the will's delay

    def delay_will(
        self, vhost: VHost, client_id: str, delay_s: int, publish: Callable[[], None]
    ) -> None:
        """Publish a will after `delay_s` (now when 0), unless its session reconnects
        first (`take_over`). Held in memory: a broker restart forgets a delayed will."""
        key = (vhost.name, client_id)
        if delay_s <= 0:
            publish()
            return

        def due() -> None:
            self._wills.pop(key, None)
            if vhost.name in self.broker.vhosts:
                publish()

        self._wills[key] = asyncio.get_running_loop().call_later(delay_s, due)

    def register(self, s: MqttSession) -> None:
        """List the open connection in `Broker.clients`, and count it for the vhost's
        and user's `max-connections` (streamq/broker/connection_tracking.py)."""
        assert s.vhost is not None
        client = MqttClient(s)
        self.broker.clients[client.name] = client
        self.broker.tracking.add(s, s.vhost.name, s.user)

    def unregister(self, s: MqttSession) -> None:
        if s.vhost is not None:
            if self.connected.get((s.vhost.name, s.client_id)) is s:
                del self.connected[(s.vhost.name, s.client_id)]
            self.broker.tracking.remove(s, s.vhost.name, s.user)
        self.broker.clients.pop(s.name, None)

    # -- retained messages -----------------------------------------------------------------

    def retained(self, vhost: VHost) -> RetainedStore:
        store = self._retained.get(vhost.name)
        if store is None:
            directory = self.broker.vhost_directory(vhost.name)
            store = self._retained[vhost.name] = RetainedStore(directory)
        return store

    def retained_changed(self, vhost: VHost) -> None:
        """Write the change behind the publish (a QoS 1 publish's PUBACK waits for it
        in `flush_retained`; a QoS 0 one's write goes on alone)."""
        task = asyncio.get_running_loop().create_task(self._flush(vhost))
        self._retained_flushing.add(task)
        task.add_done_callback(self._retained_flushing.discard)

    async def _flush(self, vhost: VHost) -> None:
        try:
            await self.retained(vhost).flush()
        except OSError as exc:
            logger.error("retained messages of vhost '%s' not written: %s", vhost.name, exc)

    def qos2(self, vhost: VHost) -> Qos2Store:
        """The unreleased QoS 2 packet identifiers of the vhost's persistent sessions."""
        store = self._qos2.get(vhost.name)
        if store is None:
            directory = self.broker.vhost_directory(vhost.name)
            store = self._qos2[vhost.name] = Qos2Store(directory)
        return store

    def binding_index(self, vhost: VHost) -> BindingIndex:
        """The bindings of the vhost's MQTT queues, by queue and shared-group member."""
        index = self._bindings.get(vhost.name)
        if index is None:
            index = self._bindings[vhost.name] = BindingIndex(vhost)
        return index

    def pubrel(self, vhost: VHost) -> PubrelStore:
        """The QoS 2 deliveries of the vhost's persistent sessions awaiting PUBCOMP."""
        store = self._pubrel.get(vhost.name)
        if store is None:
            directory = self.broker.vhost_directory(vhost.name)
            store = self._pubrel[vhost.name] = PubrelStore(directory)
        return store

    def settle_after_flush(self, vhost: VHost, held: list[tuple[Queue, int, MqttConsumer]]) -> None:
        """Settle QoS 2 deliveries a closed connection had PUBREC'd, once their PUBREL
        state is on disk (its order, mqtt_gateway/qos2_delivery.py)."""

        async def settle() -> None:
            try:
                await self.flush_stores(vhost)
            except OSError as exc:
                logger.error("PUBREL state of vhost '%s' not written: %s", vhost.name, exc)
                return  # unsettled: the queue offers them again after a restart
            for queue, offset, consumer in held:
                vhost.settle(queue, offset, consumer)
                vhost.kick(queue)

        task = asyncio.get_running_loop().create_task(settle())
        self._retained_flushing.add(task)
        task.add_done_callback(self._retained_flushing.discard)

    async def flush_stores(self, vhost: VHost) -> None:
        """Return once the retained messages and QoS 2 state (both directions) of
        `vhost` changed so far are on disk. Raises OSError when they cannot be written."""
        store = self._retained.get(vhost.name)
        if store is not None:
            await store.flush()
        qos2 = self._qos2.get(vhost.name)
        if qos2 is not None:
            await qos2.flush()
        pubrel = self._pubrel.get(vhost.name)
        if pubrel is not None:
            await pubrel.flush()

    # -- connections -----------------------------------------------------------------------

    def close_all(self, reason: str) -> None:
        for will in self._wills.values():
            will.cancel()
        self._wills.clear()
        if self._alarm_timer is not None:
            self._alarm_timer.cancel()
            self._alarm_timer = None
        for s in list(self.sessions):
            s.disconnect(ReasonCode.SERVER_SHUTTING_DOWN)
        if self.sessions:
            logger.info("closed %d MQTT connections: %s", len(self.sessions), reason)


async def start_mqtt_listener(
    gateway: MqttGateway,
    host: str,
    port: int,
    proxy_protocol: int = 0,
    trusted_proxy: TrustedProxy | None = None,
    *,
    start_serving: bool = True,
) -> asyncio.Server:
    """Listen for MQTT over TCP on host:port; with `proxy_protocol` (1 or 2: either
    version's header is accepted) each connection must start with a PROXY header. With
    `trusted_proxy` instead (a cluster leader's), a connection from a peer it accepts
    may start with one, and a header from any other peer is refused.
    `start_serving` False: bound, accepting only after `start_serving()` (the broker
    opens its listeners together). Raises OSError if it cannot bind."""
    loop = asyncio.get_running_loop()
    gateway.attach(loop)

    starter = MqttStarter(gateway, socket_endpoints)
    factory = protocol_factory(starter, proxy_protocol, trusted_proxy, gateway.protocol_factory)
    return await loop.create_server(
        factory, host, port, reuse_address=True, start_serving=start_serving
    )


async def start_mqtt_unix_listener(
    gateway: MqttGateway, path: str, proxy_protocol: int = 0, *, start_serving: bool = True
) -> UnixListener:
    """Listen for MQTT on a unix socket at `path` (its clients count as loopback, as
    on the AMQP socket), removing a socket file a dead broker left. Raises OSError if
    `path` is something else, another process listens on it, or it cannot be bound."""
    loop = asyncio.get_running_loop()
    gateway.attach(loop)
    numbers = itertools.count(1)

    def unix_endpoints() -> Endpoints:
        return ("unix", next(numbers), path, 0)

    def factory() -> asyncio.BaseProtocol:
        if proxy_protocol:
            return ProxyHeaderReceiver(MqttStarter(gateway, lambda _: unix_endpoints()))
        return MqttSession(gateway, unix_endpoints())

    return await listen_unix(factory, path, start_serving=start_serving)
