"""One MQTT connection: bytes read to packets, the packets' work, replies written in order.

Owns `MqttSession`, the asyncio Protocol of one connection: it feeds what the socket
reads to the sans-IO codec (`mqtt_gateway.codec.Decoder`, capped at the maximum packet
size), enforces the connection's rules the codec leaves to it (CONNECT first and once,
MQTT-3.1.0-2; keep-alive, closing a client silent for 1.5 times its keep-alive,
MQTT-3.1.2-24), and answers each packet. Replies that promise durability wait for a
sync round of the vhost's log (PUBACK and PUBREC of a publish, SUBACK and UNSUBACK of a
persistent session's subscriptions, as a publisher confirm and a durable binding's
Bind-Ok do); every reply queued behind one waits with it, so replies leave in the order
of the packets (MQTT-4.6.0-2). Each PUBLISH to the client goes through `send_publish`:
a 5.0 client's Maximum Packet Size drops it before a Topic Alias it sets is recorded.
The work on the broker (login, subscriptions, publishes,
retained messages, wills, clean-up) is `mqtt_gateway.broker_side`'s; this module must
not open listeners nor hold state shared by connections (`MqttGateway`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import struct
import time
from typing import TYPE_CHECKING, Final, cast

from mqtt_gateway import broker_side, qos2_delivery, subscriptions
from mqtt_gateway.codec import (
    NO_PROPERTIES,
    ConnAck,
    ConnackReturnCode,
    Connect,
    Decoder,
    Disconnect,
    MqttCodecError,
    Packet,
    PingReq,
    PingResp,
    Properties,
    ProtocolLevel,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    ReasonCode,
    Subscribe,
    Unsubscribe,
    UnsupportedProtocolVersion,
    check_topic_name,
    encode,
)
from mqtt_gateway.codec.runs import PublishRun, RunForm
from mqtt_gateway.confirms import Confirms, Inflight
from mqtt_gateway.consumer import MqttConsumer
from mqtt_gateway.pubrel_store import Released
from mqtt_gateway.read_gate import ReadGate
from mqtt_gateway.subscription_options import Options
from mqtt_gateway.topic_aliases import TopicAliases
from streamq.broker.errors import BrokerError
from streamq.broker.queue import Queue
from streamq.broker.vhost import VHost
from streamq.log.errors import LogError

if TYPE_CHECKING:
    from mqtt_gateway.server import MqttGateway

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_S: Final = 10.0  # RabbitMQ's handshake_timeout: CONNECT within this
KEEP_ALIVE_FACTOR: Final = 1.5  # MQTT-3.1.2-24: one and a half keep-alive periods
WRITE_BUFFER_HIGH_BYTES: Final = 4 * 1024 * 1024  # deliveries pause above this
PACKET_ID_MAX: Final = 0xFFFF
_PUBACK: Final = struct.Struct(">BBH")  # fixed header, remaining length 2, packet id
_PUBACK_FIRST_BYTE: Final = 0x40
_PUBACK_LENGTH: Final = 2

Endpoints = tuple[str, int, str, int]  # peer host, peer port, host, port


def encode_reply(packet: Packet, level: ProtocolLevel) -> bytes:
    """`encode`, with a short cut for the one reply per QoS 1 publish: a PUBACK with
    reason 0 and no properties is the same 4 bytes at every level (5.0's short form).
    It saves the general encoder's work on every QoS 1 publish: the broker's CPU per
    publish went from 16-18 to 14-15 us (docs/benchmarks.md)."""
    if type(packet) is PubAck and not packet.reason_code and packet.properties is NO_PROPERTIES:
        return _PUBACK.pack(_PUBACK_FIRST_BYTE, _PUBACK_LENGTH, packet.packet_id)
    return encode(packet, level)


class MqttSession(asyncio.Protocol):
    """One client connection speaking MQTT 3.1, 3.1.1 or 5.0."""

    def __init__(self, gateway: MqttGateway, endpoints: Endpoints | None) -> None:
        self.gateway = gateway
        self.broker = gateway.broker
        self.decoder = Decoder(packet_bytes_max=gateway.packet_bytes_max)
        self.transport: asyncio.Transport | None = None
        self.endpoints = endpoints  # (peer host, peer port, host, port); None: from socket
        self.websocket = False  # over a WebSocket (mqtt_gateway/websocket.py)
        self.cross_origin = False  # a WebSocket from another site's page: not local
        self.auth_mechanism = "PLAIN"  # "EXTERNAL": logged in by its TLS certificate
        self.level = ProtocolLevel.MQTT_3_1_1
        self.connect: Connect | None = None
        self.client_id = ""
        self.user = ""
        self.vhost: VHost | None = None
        self.persistent = False  # the session outlives the connection
        self.session_expiry_s = 0  # MQTT 5.0's Session Expiry Interval
        self.consumers: dict[str, MqttConsumer] = {}  # by the queue's name
        # Queue name -> filter -> the subscription's options (subscriptions.py).
        self.subscriptions: dict[str, dict[str, Options]] = {}
        self.options_in_use = False  # a subscription has an option a delivery must read
        # A subscription has No Local: its publishes carry its client id (mapping.py).
        self.no_local_in_use = False
        self.inflight: dict[int, Inflight] = {}  # packet id -> delivery awaiting PUBACK/PUBREC
        self.inflight_max = gateway.max_inflight_messages
        # QoS 2 deliveries PUBREC'd, PUBREL sent, awaiting PUBCOMP: packet id -> delivery.
        self.pubrel: dict[int, Released] = {}
        # The vhost's deliveries PUBREC'd before the broker's restart (the PUBREL state
        # on disk when it started, `PubrelStore.recovered`, shared): if their queue
        # offers one again (its ack had not reached the disk), it is settled unsent,
        # to any consumer (a shared group's other members too): a client has it.
        self.pubrel_recovered: set[Released] = set()
        self.pubcomps: list[tuple[int, Released]] = []  # to remove from the store
        self.forgetting = False  # qos2_delivery's loop removes them
        self.settling: list[Inflight] = []  # PUBREC'd, settled once the PUBREL state is written
        self.packet_bytes_max_out: int | None = None  # 5.0: the client's Maximum Packet Size
        self.qos2_received: set[int] = set()  # packet ids PUBREC'd, awaiting PUBREL
        self.retained_inflight: set[int] = set()  # QoS 1 retained messages sent, unacked
        self.topic_aliases = TopicAliases(0, 0)  # 5.0: set from CONNECT and our CONNACK
        self.connected_at_ms = int(time.time() * 1000)
        self.recv_oct = 0
        self.send_oct = 0
        self.graceful = False  # DISCONNECT received: no will
        self.closed = False
        self.write_paused = False
        self.published = False  # it has published: a resource alarm blocks it
        self.gate = ReadGate(self)  # when the socket is read
        self._next_packet_id = 0
        self._out = bytearray()  # written once per read and per drain round
        self._flush_scheduled = False
        self.confirms = Confirms(self)  # replies behind a sync round
        self._to_settle: list[Inflight] = []
        self._form: RunForm | None = None  # `_run_form`'s, for `_form_publisher`
        self._form_publisher: str | None = None
        self.last_read_s = time.monotonic()
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    # -- socket events -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH_BYTES)
        if self.endpoints is None:
            own = transport.get_extra_info("sockname")
            peer = transport.get_extra_info("peername")
            if isinstance(own, tuple) and isinstance(peer, tuple):
                self.endpoints = (str(peer[0]), int(peer[1]), str(own[0]), int(own[1]))
        self.gateway.sessions.add(self)
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(CONNECT_TIMEOUT_S, self._connect_timeout)

    @property
    def peer(self) -> str:
        return "?" if self.endpoints is None else f"{self.endpoints[0]}:{self.endpoints[1]}"

    @property
    def name(self) -> str:
        """As the management API names a connection."""
        if self.endpoints is None:
            return self.peer
        peer_host, peer_port, host, port = self.endpoints
        return f"{peer_host}:{peer_port} -> {host}:{port}"

    def data_received(self, data: bytes) -> None:
        if self.is_closed():
            return
        self.last_read_s = time.monotonic()
        self.recv_oct += len(data)
        decoder = self.decoder
        publishes = False
        try:
            decoder.push(data)
            while (item := decoder.pop(self._run_form())) is not None:
                publishes = publishes or type(item) is PublishRun or type(item) is Publish
                self._handle_safely(item)
                if self.is_closed():
                    break  # the rest of the read goes unanswered
        except MqttCodecError as exc:
            if not self.closed:
                self._refuse_bytes(exc)
            return
        self.flush()
        vhost = self.vhost
        if publishes and vhost is not None and vhost.dirty:
            self.gate.hold_for_drain()

    def _run_form(self) -> RunForm | None:
        """How runs of this session's publishes are stored (`broker_side.run_form`);
        None before CONNECT is accepted (no run then: each packet is judged alone)."""
        if self.connect is None or self.vhost is None:
            return None
        publisher = self.client_id if self.no_local_in_use else None
        form = self._form
        if form is None or publisher != self._form_publisher:
            form = self._form = broker_side.run_form(publisher)
            self._form_publisher = publisher
        return form

    def open_channel_count(self) -> int:
        """MQTT has no channels (for streamq/broker/connection_tracking.py)."""
        return 0

    def is_closed(self) -> bool:
        return self.closed

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for task in self._tasks:
            task.cancel()
        self.gateway.sessions.discard(self)
        if self.connect is not None and self.vhost is not None:
            broker_side.release(self)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self.kick()

    # -- packets -------------------------------------------------------------------------

    def _handle_safely(self, packet: Packet | PublishRun) -> None:
        try:
            self._handle(packet)
        except (BrokerError, LogError) as exc:
            logger.warning("closing MQTT connection %s: %s", self.peer, exc)
            self.disconnect(ReasonCode.UNSPECIFIED_ERROR)
        except Exception:
            logger.exception("closing MQTT connection %s: internal error", self.peer)
            self.disconnect(ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR)

    def _handle(self, packet: Packet | PublishRun) -> None:
        if type(packet) is PublishRun:
            broker_side.publish_run(self, packet)
            return
        if isinstance(packet, Connect):
            if self.connect is not None:
                # MQTT-3.1.0-2: a second CONNECT is a protocol violation; close.
                self.disconnect(ReasonCode.PROTOCOL_ERROR)
                return
            self._connect(packet)
            return
        if isinstance(packet, Publish):
            broker_side.publish(self, packet)
        elif isinstance(packet, PubAck):
            self._puback(packet.packet_id)
        elif isinstance(packet, PubRel):
            broker_side.release_qos2(self, packet.packet_id)
        elif isinstance(packet, PubRec):
            qos2_delivery.pubrec(self, packet)
        elif isinstance(packet, PubComp):
            qos2_delivery.pubcomp(self, packet.packet_id)
        elif isinstance(packet, Subscribe):
            retained = subscriptions.subscribe(self, packet)
            vhost = self.vhost
            assert vhost is not None
            for topic_filter, qos, identifier in retained:
                broker_side.send_retained(self, vhost, topic_filter, qos, identifier)
        elif isinstance(packet, Unsubscribe):
            subscriptions.unsubscribe(self, packet)
        elif isinstance(packet, PingReq):
            self.reply(PingResp())
        elif isinstance(packet, Disconnect):
            self._disconnect_received(packet)
        else:
            # CONNACK, SUBACK, UNSUBACK, PINGRESP are the server's to send; AUTH
            # exchanges need an authentication method, which CONNECT never names here.
            self.disconnect(ReasonCode.PROTOCOL_ERROR)

    def _connect(self, packet: Connect) -> None:
        self.level = packet.protocol_level
        self.decoder.protocol_level = packet.protocol_level
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        try:
            refusal = broker_side.connect(self, packet)
        except Exception:
            # Nothing may precede CONNACK (MQTT-3.2.0-1): the refusal is "server
            # unavailable"; what the session took is released when the socket closes.
            logger.exception("refusing MQTT connection %s: internal error", self.peer)
            v5 = self.level is ProtocolLevel.MQTT_5
            refusal = ReasonCode.SERVER_UNAVAILABLE if v5 else ConnackReturnCode.SERVER_UNAVAILABLE
        if refusal is not None:
            self.write(encode(ConnAck(refusal), self.level))
            self.close_transport()
            return
        self.connect = packet
        keep_alive_s = packet.keep_alive_s
        if keep_alive_s:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(keep_alive_s, self._check_keep_alive)

    def _disconnect_received(self, packet: Disconnect) -> None:
        # MQTT 5.0: reason 0x04 asks for the will all the same (3.14.2.1).
        self.graceful = packet.reason_code != ReasonCode.DISCONNECT_WITH_WILL_MESSAGE
        expiry = packet.properties.session_expiry_interval_s
        if expiry is not None:
            if self.session_expiry_s == 0 and expiry:
                # MQTT-3.14.2-2: not from zero to non-zero at DISCONNECT.
                self.graceful = False
                self.disconnect(ReasonCode.PROTOCOL_ERROR)
                return
            self.session_expiry_s = expiry
            self.persistent = expiry > 0  # 0: the session ends with this connection
        self.close_transport()

    def _puback(self, packet_id: int) -> None:
        held = self.inflight.pop(packet_id, None)
        if held is None:
            # A retained message's (on no queue), or an unknown packet id: PUBACK has no
            # answer to give.
            self.retained_inflight.discard(packet_id)
            return
        queue, offset, consumer = held
        vhost = self.vhost
        assert vhost is not None
        queue.stats.ack += 1
        self.unblock()
        vhost.settle(queue, offset, consumer)
        vhost.kick(queue)

    # -- keep-alive and closing ----------------------------------------------------------

    def _connect_timeout(self) -> None:
        self._timer = None
        if self.connect is None and not self.closed:
            logger.warning("closing MQTT connection %s: no CONNECT in time", self.peer)
            self.close_transport()

    def _check_keep_alive(self) -> None:
        self._timer = None
        connect = self.connect
        if self.closed or connect is None:
            return
        limit_s = connect.keep_alive_s * KEEP_ALIVE_FACTOR
        silent_s = time.monotonic() - self.last_read_s
        if self.gate.alarm:
            silent_s = 0.0  # held unread by a resource alarm: its pings wait in the socket
        if silent_s >= limit_s:
            logger.warning(
                "closing MQTT connection %s (client id '%s'): keep-alive of %d s passed",
                self.peer,
                self.client_id,
                connect.keep_alive_s,
            )
            self.disconnect(ReasonCode.KEEP_ALIVE_TIMEOUT)
            return
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(limit_s - silent_s, self._check_keep_alive)

    def _refuse_bytes(self, exc: MqttCodecError) -> None:
        """Answer bytes the codec refused: a CONNACK with the refusal while CONNECT is
        being read (3.x only where a return code exists), else a 5.0 DISCONNECT, else
        just close (3.1.1 section 4.8)."""
        logger.warning("closing MQTT connection %s: %s", self.peer, exc)
        level = exc.protocol_level
        if self.connect is None:
            if level is ProtocolLevel.MQTT_5:
                self.write(encode(ConnAck(exc.reason_code), level))
            elif level is not None and exc.connack_return_code is not None:
                self.write(encode(ConnAck(exc.connack_return_code), level))
            elif isinstance(exc, UnsupportedProtocolVersion):
                # A level we do not speak: 3.1.1's CONNACK 0x01 (MQTT-3.1.2-2), which
                # every level's client reads (its two bytes are the same in each).
                unacceptable = ConnackReturnCode.UNACCEPTABLE_PROTOCOL_VERSION
                self.write(encode(ConnAck(unacceptable), ProtocolLevel.MQTT_3_1_1))
            self.close_transport()
            return
        self.disconnect(exc.reason_code)

    def disconnect(self, reason: int) -> None:
        """Close the connection after our DISCONNECT with `reason` (5.0 only: 3.x has
        none, the server just closes)."""
        if self.closed:
            return
        if self.connect is not None and self.level is ProtocolLevel.MQTT_5:
            self.confirms.owed.clear()  # nothing after a DISCONNECT (MQTT-3.14.4-1 by analogy)
            self.write(encode(Disconnect(reason), self.level))
        self.close_transport()

    def close_by_admin(self, reason: str) -> None:
        logger.warning("closing MQTT connection %s: %s", self.peer, reason)
        self.disconnect(ReasonCode.ADMINISTRATIVE_ACTION)

    def close_soon(self, reason: str) -> None:
        logger.warning("closing MQTT connection %s: %s", self.peer, reason)
        self.disconnect(ReasonCode.UNSPECIFIED_ERROR)

    def close_transport(self) -> None:
        """Write what is pending, then close; the clean-up runs in `connection_lost`."""
        if self.closed:
            return
        self.flush()
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # -- output --------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        self._out += data
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self._flush_scheduled = False
        if self._to_settle:
            self._settle_pending()
        if self._out and self.transport is not None and not self.transport.is_closing():
            self.send_oct += len(self._out)
            self.transport.write(bytes(self._out))
        self._out.clear()

    def reply(
        self, packet: Packet, *, durable: bool = False, counted: bool = False,
        definitions: bool = False, settle: Inflight | None = None,
    ) -> None:  # fmt: skip
        """Send a reply now, or, with `durable` or while replies wait for a sync round,
        after the next round ends (in the order asked). `counted`: a publish's ack,
        counted by the `ReadGate`; `definitions`: the round must cover the vhost's
        definitions journal too (a durable queue or binding); `settle`: a QoS 2
        delivery's PUBREL, the delivery settled once the PUBREL state is written."""
        data = encode_reply(packet, self.level)
        confirms = self.confirms
        if not (durable or definitions or settle is not None or confirms.owed or confirms.running):
            self.write(data)  # nothing owed, none in a round: it may go now
            return
        if settle is not None:
            self.settling.append(settle)
        self.confirms.owe(data, counted, settle, durable=durable, definitions=definitions)

    def spawn(self, work: object) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(work)  # type: ignore[arg-type]  # a coroutine
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def owe_publish_ack(self, packet: Packet) -> None:
        """A PUBACK or PUBREC, once the publish is on disk; reading stops while too
        many wait (`ReadGate`)."""
        self.gate.owe_ack()
        self.reply(packet, durable=True, counted=True)

    def owe_publish_acks(self, data: bytes, count: int) -> None:
        """`count` PUBACKs encoded in `data` (a run's), sent together once the publishes
        are on disk."""
        self.gate.owe_ack(count)
        self.confirms.owe(data, count, None, durable=True, definitions=False)

    def note_publish(self) -> None:
        """It publishes: while a resource alarm lasts, it is not read after this read."""
        if not self.published:
            self.published = True
            if self.gateway.alarm:
                self.gate.hold_for_alarm(True)

    # -- deliveries ----------------------------------------------------------------------

    def deliverable(self) -> bool:
        return not self.closed and not self.write_paused and self.connect is not None

    def can_name(self, topic: str) -> bool:
        """Whether `topic` can go out as an MQTT topic name."""
        if not topic:
            return False
        try:
            check_topic_name(topic)
        except MqttCodecError:
            return False
        return True

    def take_packet_id(self) -> int:
        """A packet identifier no delivery in flight holds."""
        for _ in range(PACKET_ID_MAX):
            self._next_packet_id = self._next_packet_id % PACKET_ID_MAX + 1
            candidate = self._next_packet_id
            if (
                candidate not in self.inflight
                and candidate not in self.retained_inflight
                and candidate not in self.pubrel
            ):
                return candidate
        raise AssertionError("more deliveries in flight than packet identifiers")

    def send_publish(
        self, topic: str, payload: bytes, qos: int, packet_id: int | None, dup: bool, *,
        retain: bool = False, properties: Properties = NO_PROPERTIES,
    ) -> bool:  # fmt: skip
        """Write a PUBLISH, in 5.0 with `properties` (a delivery's subscription
        identifiers among them) and a Topic Alias when the client allows them; False,
        writing nothing, when it is larger than the 5.0 client's Maximum Packet Size
        (MQTT-3.1.2-25: the server discards it). A new alias is recorded only once its
        PUBLISH is written: the client must never be sent an alias it never saw set."""
        aliases = self.topic_aliases
        name, alias = aliases.proposed(topic) if aliases.outbound_max else (topic, None)
        if alias is not None:
            packet = Publish(name, payload, qos, retain, dup, packet_id,
                             dataclasses.replace(properties, topic_alias=alias))  # fmt: skip
        else:
            packet = Publish(topic, payload, qos, retain, dup, packet_id, properties)
        data = encode(packet, self.level)
        limit = self.packet_bytes_max_out
        if limit is not None and len(data) > limit and name and alias is not None:
            # Setting a new alias costs 3 bytes: by name without it, if that fits.
            alias = None
            packet = Publish(topic, payload, qos, retain, dup, packet_id, properties)
            data = encode(packet, self.level)
        if limit is not None and len(data) > limit:
            logger.debug("PUBLISH of %d bytes dropped for MQTT client '%s' (maximum %d)",
                         len(data), self.client_id, limit)  # fmt: skip
            return False
        if alias is not None and name:
            aliases.record(topic, alias)
        self.write(data)
        return True

    def settle_later(self, queue: Queue, offset: int, consumer: MqttConsumer) -> None:
        """Settle a delivery that needs no PUBACK once the drain round that made it is
        over (the queue's cursor counts it delivered only after the consumer returns)."""
        self._to_settle.append((queue, offset, consumer))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def _settle_pending(self) -> None:
        settled, self._to_settle = self._to_settle, []
        vhost = self.vhost
        if vhost is None:
            return
        self.unblock()  # the in-flight window is the session's: any consumer may take
        for queue, offset, consumer in settled:
            vhost.settle(queue, offset, consumer)
            vhost.kick(queue)

    def kick(self) -> None:
        """The session can take deliveries again: ask for a drain of its queues."""
        vhost = self.vhost
        if vhost is not None:
            self.unblock()
            for consumer in self.consumers.values():
                vhost.kick(consumer.queue)

    def unblock(self) -> None:
        """The session's consumers may have credit again (its in-flight window is
        shared): the parked ones rejoin their queues' turns (`Queue.unblock`)."""
        for consumer in self.consumers.values():
            consumer.queue.unblock(consumer)
