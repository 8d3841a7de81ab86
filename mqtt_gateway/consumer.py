"""A session's consumer of one of its subscription queues, as the broker core wants it.

Owns `MqttConsumer`, the broker core's `Consumer` protocol (streamq/broker/queue.py) for
an MQTT session: the QoS 0 queue's consumer settles on delivery (no-ack, as RabbitMQ
consumes it), the QoS 1 and 2 queues' (and a shared queue's, at the member's QoS) hold
each delivery until the client's PUBACK (QoS 2: its PUBREC), at most the session's
`max_inflight_messages` (and a 5.0 client's Receive Maximum) at a time, QoS 2 ones
awaiting PUBCOMP counted (MQTT 5.0 section 4.9). A message the client's Maximum Packet
Size cannot take, or that a subscription's No Local holds back, is settled unsent
(MQTT-3.1.2-25); a message a persistent session PUBREC'd before a broker restart whose
ack did not reach the disk is settled unsent too (`PubrelStore.recovered`). Each
delivery becomes a PUBLISH on the session's output, at the lower of the subscription's
QoS and the QoS it was published with (`mapping.delivery_qos`), with DUP set for a
redelivery (a message the session held unacknowledged when it last went away,
MQTT-4.4.0-1), the subscription identifiers of the session's matching subscriptions
and, under Retain As Published, the publisher's retain flag (`delivery_options`); to a
5.0 client with the message's properties too (`message_properties.to_mqtt`), the
identifiers among them, and a Topic Alias where `MqttSession.send_publish` sets one. A
message of a queue with acks that goes out at QoS 0 needs no PUBACK: the session
settles it after the drain round (`MqttSession.settle_later`). Nothing here reads a socket.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import replace
from typing import TYPE_CHECKING, Final

from mqtt_gateway import mapping, message_properties
from mqtt_gateway.codec import NO_PROPERTIES, ProtocolLevel
from mqtt_gateway.subscription_options import delivery_options
from streamq.broker.queue import Queue
from streamq.log import format as fmt
from streamq.queues.classic import ReadyMessage

if TYPE_CHECKING:
    from mqtt_gateway.session import MqttSession
    from streamq.queues.offsets import AckWatermark
    from streamq.queues.window import ReadWindow

_UNLIMITED: Final = 1 << 30
_RECORD_HEADER: Final = fmt.RECORD_HEADER
_RECORD_HEADER_BYTES: Final = fmt.RECORD_HEADER_BYTES


class MqttConsumer:
    """The consumer of a session's QoS 0 or QoS 1 subscription queue."""

    __slots__ = (
        "exclusive",
        "no_ack",
        "priority",
        "qos",
        "queue",
        "session",
        "stream_position",
        "stream_redeliver",
        "stream_tracker",
        "stream_window",
        "tag",
    )

    def __init__(self, session: MqttSession, queue: Queue, qos: int, *, acks: bool) -> None:
        self.session = session
        self.queue = queue
        self.qos = qos  # a shared queue member's may change (subscriptions.consume)
        shared = queue.name.startswith(mapping.SHARED_QUEUE_PREFIX)
        self.tag = f"mqtt-{session.client_id}-" + (queue.name if shared else f"qos{qos}")
        self.no_ack = not acks
        self.exclusive = False
        self.priority = 0
        # Subscription queues are classic queues: the stream fields are never read.
        self.stream_position = 0
        self.stream_redeliver: deque[int] = deque()
        self.stream_tracker: AckWatermark | None = None
        self.stream_window: ReadWindow | None = None

    @property
    def stream_filtered(self) -> bool:
        return False

    def accepts(self, properties_raw: bytes) -> bool:
        return True

    def can_take(self) -> bool:
        return self.credit() > 0

    def credit(self) -> int:
        session = self.session
        if not session.deliverable():
            return 0
        if self.no_ack:
            return _UNLIMITED
        return max(session.inflight_max - len(session.inflight) - len(session.pubrel), 0)

    def cancel_by_broker(self) -> None:
        """The queue was deleted (by an operator) or failed: MQTT has no way to say so
        but closing the connection, which RabbitMQ 3.10 does too."""
        self.session.consumers.pop(self.queue.name, None)
        self.session.close_soon(f"subscription queue '{self.queue.name}' is gone")

    def deliver(self, queue: Queue, message: ReadyMessage, record: fmt.Record) -> None:
        self._send(
            queue,
            message.offset,
            record.routing_key,
            record.properties,
            record.body,
            message.redelivered,
            record.timestamp_ms,
        )

    def deliver_records(
        self,
        queue: Queue,
        records: bytes | bytearray | memoryview,
        position: int,
        first: int,
        count: int,
    ) -> tuple[int, int, int, list[int]]:
        """Deliver the records from offset `first` on, one PUBLISH each (the records are
        checked already: the queue's read window checked their CRCs)."""
        sizes: list[int] = []
        end = len(records)
        limit = min(count, self.credit())
        next_offset = -1  # the offset of the record at `position`, once one was read
        while len(sizes) < limit and position + _RECORD_HEADER_BYTES <= end:
            length, _crc, offset, stored_ms, lex, lrk, _flags, lprops = _RECORD_HEADER.unpack_from(
                records, position
            )
            record_end = position + 4 + length
            if record_end > end:
                break
            position = record_end
            next_offset = offset + 1
            if offset < first:
                continue
            a = record_end - length - 4 + _RECORD_HEADER_BYTES + lex
            b = a + lrk
            c = b + lprops
            body = bytes(records[c:record_end])
            routing_key, properties_raw = bytes(records[a:b]), bytes(records[b:c])
            self._send(queue, offset, routing_key, properties_raw, body, False, stored_ms)
            sizes.append(len(body))
        return len(sizes), position, next_offset, sizes

    def deliver_stream_records(
        self,
        queue: Queue,
        records: bytes | bytearray | memoryview,
        position: int,
        first: int,
        count: int,
    ) -> tuple[int, int, int, bool]:
        raise AssertionError("MQTT subscription queues are never streams")

    def _send(
        self,
        queue: Queue,
        offset: int,
        routing_key: bytes,
        properties_raw: bytes,
        body: bytes,
        redelivered: bool,
        stored_ms: int,
    ) -> None:
        session = self.session
        qos = mapping.delivery_qos(self.qos, properties_raw)
        topic = mapping.to_topic(routing_key.decode(errors="replace"))
        send = session.can_name(topic)  # else an AMQP routing key with a wildcard, or empty
        identifiers: tuple[int, ...] = ()
        retain = False
        options = session.subscriptions.get(queue.name) if session.options_in_use else None
        if send and options:
            send, identifiers, retain = delivery_options(
                options, topic, session.client_id, properties_raw
            )  # No Local may hold it back
        recovered = session.pubrel_recovered
        if recovered and (queue.name, offset) in recovered:
            recovered.discard((queue.name, offset))
            send = False  # a client has it (PUBREC'd before a restart)
        if not send:
            if not self.no_ack:
                session.settle_later(queue, offset, self)  # it leaves the queue unsent
            return
        properties = NO_PROPERTIES
        if session.level is ProtocolLevel.MQTT_5:
            now_ms = int(time.time() * 1000)
            properties = message_properties.to_mqtt(properties_raw, stored_ms, now_ms)
            if identifiers:
                # (A persistent session's 5.0 identifiers stay in its bindings when it
                # comes back at 3.1.1, which has no properties.)
                properties = replace(properties, subscription_identifiers=identifiers)
        if qos == 0:
            session.send_publish(topic, body, 0, None, False, retain=retain,
                                 properties=properties)  # fmt: skip
            if not self.no_ack:
                session.settle_later(queue, offset, self)
            return
        packet_id = session.take_packet_id()
        if session.send_publish(topic, body, qos, packet_id, redelivered, retain=retain,
                                properties=properties):  # fmt: skip
            session.inflight[packet_id] = (queue, offset, self)
        else:
            session.settle_later(queue, offset, self)  # past the client's maximum size
