"""Clients for the MQTT gateway's tests: paho-mqtt wrapped to block with timeouts, and a
raw socket speaking through our own codec for what paho will not send (a second
CONNECT, silence past the keep-alive, a connection dropped without DISCONNECT)."""

from __future__ import annotations

import queue
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Final

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from mqtt_gateway.codec import Decoder, Packet, ProtocolLevel, encode

WAIT_S: Final = 10.0
VERSIONS: Final = {"3.1": mqtt.MQTTv31, "3.1.1": mqtt.MQTTv311, "5.0": mqtt.MQTTv5}


class Paho:
    """One paho client on its own network thread; every call waits for its answer."""

    def __init__(
        self,
        port: int,
        client_id: str,
        *,
        version: str = "3.1.1",
        clean: bool = True,
        username: str | None = "guest",
        password: str | None = "guest",
        keepalive: int = 60,
        session_expiry_s: int | None = None,
    ) -> None:
        self.port = port
        self.version = version
        self.clean = clean
        self.keepalive = keepalive
        self.session_expiry_s = session_expiry_s
        v5 = version == "5.0"
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=VERSIONS[version],
            clean_session=None if v5 else clean,
        )
        if username is not None:
            self.client.username_pw_set(username, password)
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.connack: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.subacks: queue.Queue[list[Any]] = queue.Queue()
        self.unsubacks: queue.Queue[list[Any]] = queue.Queue()
        self.disconnects: queue.Queue[Any] = queue.Queue()
        self.acked: dict[int, threading.Event] = {}
        self._lock = threading.Lock()
        self.client.on_connect = lambda _c, _u, flags, code, _p: self.connack.put((flags, code))
        self.client.on_subscribe = lambda _c, _u, _m, codes, _p: self.subacks.put(list(codes))
        self.client.on_unsubscribe = lambda _c, _u, _m, codes, _p: self.unsubacks.put(list(codes))
        self.client.on_message = lambda _c, _u, message: self.messages.put(message)
        self.client.on_publish = self._on_publish
        self.client.on_disconnect = lambda _c, _u, _f, code, _p: self.disconnects.put(code)

    def _on_publish(self, _c: Any, _u: Any, mid: int, _code: Any, _p: Any) -> None:
        with self._lock:
            self.acked.setdefault(mid, threading.Event()).set()

    def connect(self, will: tuple[str, bytes, int, bool] | None = None) -> tuple[bool, int]:
        """(session present, CONNACK code as an int)."""
        if will is not None:
            topic, payload, qos, retain = will
            self.client.will_set(topic, payload, qos, retain)
        properties = None
        kwargs: dict[str, Any] = {}
        if self.version == "5.0":
            kwargs["clean_start"] = self.clean
            if self.session_expiry_s is not None:
                properties = PahoProperties(PacketTypes.CONNECT)
                properties.SessionExpiryInterval = self.session_expiry_s
            kwargs["properties"] = properties
        self.client.connect("127.0.0.1", self.port, self.keepalive, **kwargs)
        self.client.loop_start()
        flags, code = self.connack.get(timeout=WAIT_S)
        return bool(flags.session_present), int(code.value)

    def subscribe(self, topic_filter: str, qos: int = 0) -> list[int]:
        self.client.subscribe(topic_filter, qos)
        return [int(code.value) for code in self.subacks.get(timeout=WAIT_S)]

    def unsubscribe(self, topic_filter: str) -> list[Any]:
        self.client.unsubscribe(topic_filter)
        return self.unsubacks.get(timeout=WAIT_S)

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False) -> None:
        """Publish; for QoS 1 and 2 wait until the broker acknowledged it."""
        info = self.client.publish(topic, payload, qos, retain)
        if qos:
            with self._lock:
                event = self.acked.setdefault(info.mid, threading.Event())
            assert event.wait(WAIT_S), f"no acknowledgement of {topic} QoS {qos}"
        else:
            info.wait_for_publish(WAIT_S)

    def receive(self, count: int, timeout_s: float = WAIT_S) -> list[mqtt.MQTTMessage]:
        return [self.messages.get(timeout=timeout_s) for _ in range(count)]

    def nothing_more(self, wait_s: float = 0.5) -> bool:
        try:
            self.messages.get(timeout=wait_s)
        except queue.Empty:
            return True
        return False

    def disconnect(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def stop(self) -> None:
        """Stop the network thread without DISCONNECT (the socket stays open)."""
        self.client.loop_stop()


class RawClient:
    """A socket speaking MQTT through the gateway's own codec."""

    def __init__(
        self,
        port: int,
        level: ProtocolLevel = ProtocolLevel.MQTT_3_1_1,
        sock: socket.socket | None = None,
    ) -> None:
        self.level = level
        self.sock = sock or socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
        self.decoder = Decoder(protocol_level=level)
        self.pending: list[Packet] = []

    def send(self, *packets: Packet) -> None:
        self.sock.sendall(b"".join(encode(packet, self.level) for packet in packets))

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read(self, timeout_s: float = WAIT_S) -> Packet | None:
        """The next packet, or None when the broker closed the connection."""
        self.sock.settimeout(timeout_s)
        while not self.pending:
            data = self.sock.recv(65536)
            if not data:
                return None
            self.pending.extend(self.decoder.feed(data))
        return self.pending.pop(0)

    def closed_by_peer(self, timeout_s: float = WAIT_S) -> bool:
        """Whether the broker closes the connection within `timeout_s` (packets before
        the close are read and dropped)."""
        try:
            while self.read(timeout_s) is not None:
                pass
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        self.sock.close()


def eventually(check: Callable[[], bool], timeout_s: float = WAIT_S) -> bool:
    """Whether `check` comes true within `timeout_s` (polled every 50 ms)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False
