"""Retained messages: the last retained publish of each topic, per vhost, kept on disk.

Owns `RetainedStore`: one topic -> (QoS, payload) map per vhost, with the MQTT 5.0
properties of those that had some (as the AMQP properties the message is stored with,
`message_properties.to_amqp`, and when it was retained, for its expiry), in one file in the
vhost's directory (`mqtt_retained`), replaced whole on change (write temp, fsync, rename,
fsync the directory: `streamq.log.files.write_file_atomic`, which a cluster's file tap
records), on a worker thread, never on the event loop. Changes made while a write runs
go in the next one, so a burst of retained publishes costs a few writes. `flush()`
returns once every change made before the call is durable: a QoS 1 retained publish is
acknowledged after it, as after the log's sync. Also owns topic filter matching (MQTT 5.0
section 4.7: `+` one level, `#` the rest, wildcards at the first level never match a
topic starting with `$`), which retained messages need and routing keys do not.

Cost: the whole map is in memory and every write rewrites the file, O(bytes retained);
RETAINED_BYTES_MAX bounds both. File format, little-endian: b"SQMR", u16 version 1, then
per entry u16 topic length, topic (UTF-8), u8 QoS, u32 payload length, payload; then the
CRC32 of everything before it. Version 2, written when an entry has properties, adds to
each entry u32 properties length, properties, i64 the time it was retained (ms since
the epoch); version 1 files are still read. A file that fails its check is refused at open
(`RetainedCorrupted`), never silently emptied. It knows nothing of MQTT packets.
"""

from __future__ import annotations

import struct
import zlib
from typing import Final

from mqtt_gateway.state_file import StateFile

FILE_NAME: Final = "mqtt_retained"
MAGIC: Final = b"SQMR"
VERSION: Final = 1  # no properties: what streamq before them reads
VERSION_PROPERTIES: Final = 2
RETAINED_BYTES_MAX: Final = 64 * 1024 * 1024
"""Topics and payloads retained in one vhost, in bytes; a retained publish that would
pass it is not retained (it is still routed), and logged."""

_HEADER: Final = struct.Struct("<4sH")
_TOPIC: Final = struct.Struct("<H")
_PAYLOAD: Final = struct.Struct("<BI")
_CRC: Final = struct.Struct("<I")
_PROPERTIES: Final = struct.Struct("<I")
_RETAINED_AT: Final = struct.Struct("<q")

Messages = dict[str, tuple[int, bytes]]
PropertiesByTopic = dict[str, tuple[bytes, int]]
"""topic -> (AMQP properties, retained at ms), for the messages that have properties."""


class RetainedCorrupted(Exception):
    """The retained messages file does not pass its check."""


class RetainedStore:
    """The retained messages of one vhost."""

    __slots__ = ("bytes", "file", "messages", "properties")

    def __init__(self, directory: str) -> None:
        self.file = StateFile(directory, FILE_NAME)
        self.messages: Messages = {}
        self.properties: PropertiesByTopic = {}
        self.bytes = 0
        data = self.file.read()
        if data is None:
            return
        self.messages, self.properties = decode_all(data, self.file.path)
        self.bytes = sum(len(t.encode()) + len(p) for t, (_q, p) in self.messages.items())
        self.bytes += sum(len(p) for p, _at in self.properties.values())

    def retain(
        self, topic: str, qos: int, payload: bytes, properties: bytes = b"", retained_ms: int = 0
    ) -> bool:
        """Keep `payload` as `topic`'s retained message, with its `properties` (AMQP form;
        b"": none) retained at `retained_ms` (an empty payload clears it); False when
        RETAINED_BYTES_MAX leaves no room (nothing changed). Durable after `flush`."""
        old = self.messages.get(topic)
        size = len(topic.encode())
        freed = size + len(old[1]) if old is not None else 0
        freed += len(self.properties.get(topic, (b"", 0))[0])
        if not payload:
            if old is None:
                return True
            del self.messages[topic]
            self.properties.pop(topic, None)
            self.bytes -= freed
        else:
            added = size + len(payload) + len(properties)
            if self.bytes - freed + added > RETAINED_BYTES_MAX:
                return False
            self.messages[topic] = (qos, payload)
            if properties:
                self.properties[topic] = (properties, retained_ms)
            else:
                self.properties.pop(topic, None)
            self.bytes += added - freed
        self.file.changed()
        return True

    async def flush(self) -> None:
        """Return once every change made before the call is on disk (file and
        directory fsynced). Raises OSError (OutOfSpace among them) when it cannot be."""
        await self.file.flush(lambda: encode(self.messages, self.properties))

    def matching(self, topic_filter: str) -> list[tuple[str, int, bytes]]:
        """The retained messages whose topic `topic_filter` matches, by topic."""
        return [
            (topic, qos, payload)
            for topic, (qos, payload) in sorted(self.messages.items())
            if topic_matches(topic_filter, topic)
        ]


def topic_matches(topic_filter: str, topic: str) -> bool:
    """Whether an MQTT topic filter matches a topic name (5.0 section 4.7.1, 4.7.2)."""
    filter_levels = topic_filter.split("/")
    levels = topic.split("/")
    if topic.startswith("$") and filter_levels[0] in ("+", "#"):
        return False  # MQTT-4.7.2-1
    for index, want in enumerate(filter_levels):
        if want == "#":
            return True  # also matches the parent level: "a/#" matches "a"
        if index >= len(levels):
            return False
        if want != "+" and want != levels[index]:
            return False
    return len(levels) == len(filter_levels)


def encode(messages: Messages, properties: PropertiesByTopic | None = None) -> bytes:
    """A retained file's bytes: version 1 unless a message has properties."""
    version = VERSION_PROPERTIES if properties else VERSION
    out = bytearray(_HEADER.pack(MAGIC, version))
    for topic, (qos, payload) in sorted(messages.items()):
        name = topic.encode()
        out += _TOPIC.pack(len(name)) + name + _PAYLOAD.pack(qos, len(payload)) + payload
        if properties:
            raw, retained_ms = properties.get(topic, (b"", 0))
            out += _PROPERTIES.pack(len(raw)) + raw + _RETAINED_AT.pack(retained_ms)
    out += _CRC.pack(zlib.crc32(out))
    return bytes(out)


def decode(data: bytes, path: str) -> Messages:
    """The messages of a retained file's bytes. Raises RetainedCorrupted."""
    return decode_all(data, path)[0]


def decode_all(data: bytes, path: str) -> tuple[Messages, PropertiesByTopic]:
    """The messages of a retained file's bytes and their properties. Raises
    RetainedCorrupted."""
    if len(data) < _HEADER.size + _CRC.size:
        raise RetainedCorrupted(f"{path}: {len(data)} bytes, too short")
    (crc,) = _CRC.unpack_from(data, len(data) - _CRC.size)
    body = data[: -_CRC.size]
    if zlib.crc32(body) != crc:
        raise RetainedCorrupted(f"{path}: checksum mismatch")
    magic, version = _HEADER.unpack_from(body, 0)
    if magic != MAGIC or version not in (VERSION, VERSION_PROPERTIES):
        raise RetainedCorrupted(f"{path}: not a version {VERSION} or 2 retained messages file")
    messages: Messages = {}
    properties: PropertiesByTopic = {}
    position = _HEADER.size
    try:
        while position < len(body):
            (size,) = _TOPIC.unpack_from(body, position)
            position += _TOPIC.size
            topic = body[position : position + size].decode()
            position += size
            qos, length = _PAYLOAD.unpack_from(body, position)
            position += _PAYLOAD.size
            messages[topic] = (qos, body[position : position + length])
            position += length
            if version == VERSION_PROPERTIES:
                (length,) = _PROPERTIES.unpack_from(body, position)
                raw = body[position + _PROPERTIES.size : position + _PROPERTIES.size + length]
                position += _PROPERTIES.size + length
                (retained_ms,) = _RETAINED_AT.unpack_from(body, position)
                position += _RETAINED_AT.size
                if raw:
                    properties[topic] = (raw, retained_ms)
    except (struct.error, UnicodeDecodeError) as exc:
        raise RetainedCorrupted(f"{path}: entry at byte {position}: {exc}") from exc
    if position != len(body):
        raise RetainedCorrupted(f"{path}: an entry runs past the end")
    return messages, properties
