"""QoS 2 deliveries of persistent sessions waiting for PUBCOMP: the PUBREL state.

Owns `PubrelStore`: per vhost, client id -> packet identifier -> the delivery it
released (the subscription queue's name and the message's offset), for every QoS 2
delivery whose PUBREC came and whose PUBCOMP has not (MQTT-4.3.3, the sender's side:
after PUBREC it must send PUBREL and keep the identifier until PUBCOMP; on
reconnection it sends the PUBREL again, MQTT-4.4.0-1). Kept in one file in the vhost's
directory (`mqtt_pubrel`, JSON: {"client id": {"packet id": ["queue", offset]}}),
replaced whole on change on a worker thread (temp file, fsync, rename, fsync the
directory), as `qos2_store` keeps the receiving side.

The order that makes a delivery exactly once (docs/mqtt.md, "QoS 2 deliveries"): the
entry is on disk before the message's ack is settled on the queue, and the entry is
removed only after that ack is durable. A broker that stops between the two finds the
message in its queue again and the entry here: whichever consumer the queue offers it
to skips it (`recovered`: it is a client's already), and the session sends the PUBREL
again. At most QOS2_IDS_MAX entries per client, the packet identifiers there are. It
knows nothing of packets.
"""

from __future__ import annotations

import json
from typing import Final

from mqtt_gateway.state_file import StateFile

FILE_NAME: Final = "mqtt_pubrel"
QOS2_IDS_MAX: Final = 0xFFFF

Released = tuple[str, int]  # the subscription queue's name, the message's offset


class PubrelCorrupted(Exception):
    """The PUBREL state file does not parse."""


class PubrelStore:
    """The QoS 2 deliveries of one vhost's persistent sessions awaiting PUBCOMP."""

    __slots__ = ("entries", "file", "recovered")

    def __init__(self, directory: str) -> None:
        self.file = StateFile(directory, FILE_NAME)
        data = self.file.read()
        self.entries: dict[str, dict[int, Released]] = (
            {} if data is None else decode(data, self.file.path)
        )
        # The deliveries the file held when opened (before this process settled any):
        # a queue offering one again is skipped, each at most once (consumer.py).
        self.recovered: set[Released] = {
            released for held in self.entries.values() for released in held.values()
        }

    def of(self, client_id: str) -> dict[int, Released]:
        return dict(self.entries.get(client_id, {}))

    def add(self, client_id: str, packet_id: int, released: Released) -> None:
        """Buffered: durable after `flush`."""
        held = self.entries.setdefault(client_id, {})
        if held.get(packet_id) != released:
            held[packet_id] = released
            self.file.changed()

    def remove(self, client_id: str, packet_id: int, released: Released) -> None:
        """Forget the entry, if it is still `released` (the identifier may have been
        used again meanwhile). Buffered: durable after `flush`."""
        held = self.entries.get(client_id)
        if held is not None and held.get(packet_id) == released:
            del held[packet_id]
            if not held:
                del self.entries[client_id]
            self.file.changed()

    def drop(self, client_id: str) -> bool:
        """Forget a session's entries (it ended, or started clean); whether it had any.
        Buffered: durable after `flush`."""
        if self.entries.pop(client_id, None) is None:
            return False
        self.file.changed()
        return True

    async def flush(self) -> None:
        """Return once every change made before the call is on disk. Raises OSError."""
        await self.file.flush(lambda: encode(self.entries))


def encode(entries: dict[str, dict[int, Released]]) -> bytes:
    document = {
        client: {str(packet_id): [queue, offset] for packet_id, (queue, offset) in held.items()}
        for client, held in sorted(entries.items())
    }
    return json.dumps(document, sort_keys=True).encode()


def decode(data: bytes, path: str) -> dict[str, dict[int, Released]]:
    """Raises PubrelCorrupted for anything but {"client id": {"id": ["queue", offset]}}."""
    try:
        document = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise PubrelCorrupted(f"{path}: {exc}") from exc
    if not isinstance(document, dict):
        raise PubrelCorrupted(f"{path}: not an object")
    entries: dict[str, dict[int, Released]] = {}
    for client, held in document.items():
        if not isinstance(held, dict) or len(held) > QOS2_IDS_MAX:
            raise PubrelCorrupted(f"{path}: {client!r}: not an object of packet identifiers")
        entries[client] = {
            _packet_id(key, path): _released(value, path) for key, value in held.items()
        }
    return entries


def _packet_id(key: str, path: str) -> int:
    if not key.isdigit() or not 0 < int(key) <= QOS2_IDS_MAX:
        raise PubrelCorrupted(f"{path}: bad packet identifier {key!r}")
    return int(key)


def _released(value: object, path: str) -> Released:
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not isinstance(value[0], str)
        or not isinstance(value[1], int)
        or value[1] < 0
    ):
        raise PubrelCorrupted(f"{path}: bad delivery {value!r}")
    return value[0], value[1]
