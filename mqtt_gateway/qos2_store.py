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

import json
from typing import Final

from mqtt_gateway.state_file import StateFile

FILE_NAME: Final = "mqtt_qos2"
QOS2_IDS_MAX: Final = 0xFFFF


class Qos2Corrupted(Exception):
    """The QoS 2 state file does not parse."""


class Qos2Store:
    """The unreleased QoS 2 packet identifiers of one vhost's persistent sessions."""

    __slots__ = ("file", "ids")

    def __init__(self, directory: str) -> None:
        self.file = StateFile(directory, FILE_NAME)
        data = self.file.read()
        self.ids: dict[str, set[int]] = {} if data is None else decode(data, self.file.path)

    def of(self, client_id: str) -> set[int]:
        return set(self.ids.get(client_id, ()))

    def add(self, client_id: str, packet_id: int) -> None:
        """Buffered: durable after `flush`."""
        held = self.ids.setdefault(client_id, set())
        if packet_id not in held:
            held.add(packet_id)
            self.file.changed()

    def remove(self, client_id: str, packet_id: int) -> None:
        """Buffered: durable after `flush`."""
        held = self.ids.get(client_id)
        if held is not None and packet_id in held:
            held.discard(packet_id)
            if not held:
                del self.ids[client_id]
            self.file.changed()

    def drop(self, client_id: str) -> bool:
        """Forget a session's identifiers (it ended, or started clean); whether it had
        any. Buffered: durable after `flush`."""
        if self.ids.pop(client_id, None) is None:
            return False
        self.file.changed()
        return True

    @property
    def dirty(self) -> bool:
        return self.file.dirty

    async def flush(self) -> None:
        """Return once every change made before the call is on disk. Raises OSError."""
        await self.file.flush(lambda: encode(self.ids))


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
