"""QoS 2 state of persistent sessions: the packet identifiers received but not released.

Owns `Qos2Store`: per vhost, client id -> the packet identifiers of QoS 2 publishes that
were stored and PUBREC'd but whose PUBREL has not come (MQTT-4.3.3: the receiver keeps
them so that a resent PUBLISH with one of them is not stored again). Kept in one file in
the vhost's directory (`mqtt_qos2`, JSON: {"client id": [ids]}), replaced whole on change
on a worker thread (temp file, fsync, rename, fsync the directory), as the retained
messages are. A PUBREC goes out only once its identifier is on disk, and a PUBCOMP only
once its removal is: an identifier forgotten in memory but still on disk would drop the
client's next publish with that identifier after a restart. Clean sessions keep theirs
in memory only (they end with the connection). At most QOS2_IDS_MAX per client: the
65,535 identifiers there are. It knows nothing of packets.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Final

from streamq.log.files import write_file_atomic

FILE_NAME: Final = "mqtt_qos2"
QOS2_IDS_MAX: Final = 0xFFFF


class Qos2Corrupted(Exception):
    """The QoS 2 state file does not parse."""


class Qos2Store:
    """The unreleased QoS 2 packet identifiers of one vhost's persistent sessions."""

    __slots__ = ("_changes", "_lock", "_written", "ids", "path")

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, FILE_NAME)
        self.ids: dict[str, set[int]] = {}
        self._changes = 0
        self._written = 0
        self._lock = asyncio.Lock()
        try:
            with open(self.path, "rb") as file:
                data = file.read()
        except FileNotFoundError:
            return
        self.ids = decode(data, self.path)

    def of(self, client_id: str) -> set[int]:
        return set(self.ids.get(client_id, ()))

    def add(self, client_id: str, packet_id: int) -> None:
        """Buffered: durable after `flush`."""
        held = self.ids.setdefault(client_id, set())
        if packet_id not in held:
            held.add(packet_id)
            self._changes += 1

    def remove(self, client_id: str, packet_id: int) -> None:
        """Buffered: durable after `flush`."""
        held = self.ids.get(client_id)
        if held is not None and packet_id in held:
            held.discard(packet_id)
            if not held:
                del self.ids[client_id]
            self._changes += 1

    def drop(self, client_id: str) -> bool:
        """Forget a session's identifiers (it ended, or started clean); whether it had
        any. Buffered: durable after `flush`."""
        if self.ids.pop(client_id, None) is None:
            return False
        self._changes += 1
        return True

    @property
    def dirty(self) -> bool:
        return self._written < self._changes

    async def flush(self) -> None:
        """Return once every change made before the call is on disk. Raises OSError."""
        target = self._changes
        async with self._lock:
            if self._written >= target:
                return
            changes = self._changes
            data = encode(self.ids)
            await asyncio.to_thread(write_file_atomic, self.path, data, fsync_dir=True)
            self._written = changes


def encode(ids: dict[str, set[int]]) -> bytes:
    return json.dumps({client: sorted(held) for client, held in sorted(ids.items())}).encode()


def decode(data: bytes, path: str) -> dict[str, set[int]]:
    """Raises Qos2Corrupted for anything but {"client id": [ids 1-65535]}."""
    try:
        document = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Qos2Corrupted(f"{path}: {exc}") from exc
    if not isinstance(document, dict):
        raise Qos2Corrupted(f"{path}: not an object")
    ids: dict[str, set[int]] = {}
    for client, held in document.items():
        if not isinstance(held, list) or len(held) > QOS2_IDS_MAX:
            raise Qos2Corrupted(f"{path}: {client!r}: not a list of packet identifiers")
        for packet_id in held:
            if not isinstance(packet_id, int) or not 0 < packet_id <= QOS2_IDS_MAX:
                raise Qos2Corrupted(f"{path}: {client!r}: bad packet identifier {packet_id!r}")
        ids[client] = set(held)
    return ids
