"""A loopback MQTT peer built on our codec alone, for driving real clients (paho).

Not the broker: the MQTT session and listener are later work (issue 33). It accepts
connections on 127.0.0.1, records every byte each client sends, decodes them with
`mqtt_gateway.codec.Decoder` and answers with packets from our encoder: CONNACK (given
by `connack`), SUBACK granting each filter's QoS, PUBACK/PUBREC for QoS 1/2 publishes,
PUBCOMP for PUBREL, PINGRESP, UNSUBACK. A publish whose topic a client subscribed to
exactly is sent back to it (with its properties, so the client's decoder reads ours),
with a PUBREL for its PUBREC. Decoding errors are kept in `errors` for the test to see.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Final

from mqtt_gateway.codec import (
    ConnAck,
    Connect,
    Decoder,
    Disconnect,
    MqttCodecError,
    Packet,
    PingReq,
    PingResp,
    ProtocolLevel,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    UnsubAck,
    Unsubscribe,
    encode,
)

READ_BYTES: Final = 65536
TIMEOUT_S: Final = 10.0


@dataclass
class Connection:
    """One client's connection: the bytes it sent, and what we decoded of them."""

    sent: bytearray = field(default_factory=bytearray)
    answered: bytearray = field(default_factory=bytearray)  # what we sent back
    packets: list[Packet] = field(default_factory=list)
    level: ProtocolLevel | None = None
    subscriptions: dict[str, int] = field(default_factory=dict)
    next_packet_id: int = 1


class Responder:
    def __init__(self, connack: Callable[[Connect], ConnAck] = lambda _connect: ConnAck()) -> None:
        self.connack = connack
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.connections: list[Connection] = []
        self.errors: list[BaseException] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        accept = threading.Thread(target=self._accept, daemon=True)
        accept.start()
        self._threads.append(accept)

    def close(self) -> None:
        # shutdown() wakes the accept() blocked in the other thread; close() alone does not.
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        for thread in self._threads:
            thread.join(TIMEOUT_S)

    def __enter__(self) -> Responder:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            connection = Connection()
            with self._lock:
                self.connections.append(connection)
            thread = threading.Thread(target=self._serve, args=(client, connection), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _serve(self, client: socket.socket, connection: Connection) -> None:
        client.settimeout(TIMEOUT_S)
        decoder = Decoder()
        with client:
            while True:
                try:
                    data = client.recv(READ_BYTES)
                except OSError:
                    return
                if not data:
                    return
                connection.sent += data
                try:
                    packets = decoder.feed(data)
                except MqttCodecError as exc:
                    self.errors.append(exc)
                    return
                for packet in packets:
                    connection.packets.append(packet)
                    if isinstance(packet, Disconnect):
                        return
                    answer = b"".join(self._answer(connection, packet))
                    connection.answered += answer
                    with contextlib.suppress(OSError):
                        client.sendall(answer)

    def _answer(self, connection: Connection, packet: Packet) -> list[bytes]:
        if isinstance(packet, Connect):
            connection.level = packet.protocol_level
        level = connection.level
        assert level is not None
        answers: list[Packet] = []
        match packet:
            case Connect():
                answers.append(self.connack(packet))
            case Subscribe():
                for subscription in packet.subscriptions:
                    connection.subscriptions[subscription.topic_filter] = subscription.qos
                codes = tuple(subscription.qos for subscription in packet.subscriptions)
                answers.append(SubAck(packet.packet_id, codes))
            case Unsubscribe():
                codes = (0,) * len(packet.topic_filters) if level is ProtocolLevel.MQTT_5 else ()
                answers.append(UnsubAck(packet.packet_id, codes))
            case Publish():
                answers += self._on_publish(connection, packet)
            case PubRel():
                answers.append(PubComp(packet.packet_id))
            case PubRec():
                answers.append(PubRel(packet.packet_id))
            case PingReq():
                answers.append(PingResp())
        return [encode(answer, level) for answer in answers]

    def _on_publish(self, connection: Connection, publish: Publish) -> list[Packet]:
        answers: list[Packet] = []
        if publish.qos == 1:
            answers.append(PubAck(publish.packet_id or 0))
        elif publish.qos == 2:
            answers.append(PubRec(publish.packet_id or 0))
        granted = connection.subscriptions.get(publish.topic)
        if granted is not None:
            qos = min(granted, publish.qos)
            packet_id = None
            if qos:
                packet_id = connection.next_packet_id
                connection.next_packet_id += 1
            answers.append(replace(publish, qos=qos, packet_id=packet_id, dup=False))
        return answers
