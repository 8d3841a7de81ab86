"""Retained messages: the last retained publish of each topic, per vhost, kept on disk.

Owns `RetainedStore`: one topic -> (QoS, payload) map per vhost, in one file in the
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
CRC32 of everything before it. A file that fails its check is refused at open
(`RetainedCorrupted`), never silently emptied. It knows nothing of MQTT packets.
"""

from __future__ import annotations

import asyncio
import os
import struct
import zlib
from typing import Final

from streamq.log.files import write_file_atomic

FILE_NAME: Final = "mqtt_retained"
MAGIC: Final = b"SQMR"
VERSION: Final = 1
RETAINED_BYTES_MAX: Final = 64 * 1024 * 1024
"""Topics and payloads retained in one vhost, in bytes; a retained publish that would
pass it is not retained (it is still routed), and logged."""

_HEADER: Final = struct.Struct("<4sH")
_TOPIC: Final = struct.Struct("<H")
_PAYLOAD: Final = struct.Struct("<BI")
_CRC: Final = struct.Struct("<I")


class RetainedCorrupted(Exception):
    """The retained messages file does not pass its check."""


class RetainedStore:
    """The retained messages of one vhost."""

    __slots__ = ("_changes", "_lock", "_written", "bytes", "messages", "path")

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, FILE_NAME)
        self.messages: dict[str, tuple[int, bytes]] = {}
        self.bytes = 0
        self._changes = 0  # counts changes; `_written` is the count the file holds
        self._written = 0
        self._lock = asyncio.Lock()
        try:
            with open(self.path, "rb") as file:
                data = file.read()
        except FileNotFoundError:
            return
        self.messages = decode(data, self.path)
        self.bytes = sum(len(t.encode()) + len(p) for t, (_q, p) in self.messages.items())

    def retain(self, topic: str, qos: int, payload: bytes) -> bool:
        """Keep `payload` as `topic`'s retained message (an empty one clears it); False
        when RETAINED_BYTES_MAX leaves no room (nothing changed). Durable after `flush`."""
        old = self.messages.get(topic)
        size = len(topic.encode())
        freed = size + len(old[1]) if old is not None else 0
        if not payload:
            if old is None:
                return True
            del self.messages[topic]
            self.bytes -= freed
        else:
            if self.bytes - freed + size + len(payload) > RETAINED_BYTES_MAX:
                return False
            self.messages[topic] = (qos, payload)
            self.bytes += size + len(payload) - freed
        self._changes += 1
        return True

    async def flush(self) -> None:
        """Return once every change made before the call is on disk (file and
        directory fsynced). Raises OSError (OutOfSpace among them) when it cannot be."""
        target = self._changes
        async with self._lock:
            if self._written >= target:
                return
            changes = self._changes
            data = encode(self.messages)
            await asyncio.to_thread(write_file_atomic, self.path, data, fsync_dir=True)
            self._written = changes

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


def encode(messages: dict[str, tuple[int, bytes]]) -> bytes:
    out = bytearray(_HEADER.pack(MAGIC, VERSION))
    for topic, (qos, payload) in sorted(messages.items()):
        name = topic.encode()
        out += _TOPIC.pack(len(name)) + name + _PAYLOAD.pack(qos, len(payload)) + payload
    out += _CRC.pack(zlib.crc32(out))
    return bytes(out)


def decode(data: bytes, path: str) -> dict[str, tuple[int, bytes]]:
    """The messages of a retained file's bytes. Raises RetainedCorrupted."""
    if len(data) < _HEADER.size + _CRC.size:
        raise RetainedCorrupted(f"{path}: {len(data)} bytes, too short")
    (crc,) = _CRC.unpack_from(data, len(data) - _CRC.size)
    body = data[: -_CRC.size]
    if zlib.crc32(body) != crc:
        raise RetainedCorrupted(f"{path}: checksum mismatch")
    magic, version = _HEADER.unpack_from(body, 0)
    if magic != MAGIC or version != VERSION:
        raise RetainedCorrupted(f"{path}: not a version {VERSION} retained messages file")
    messages: dict[str, tuple[int, bytes]] = {}
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
    except (struct.error, UnicodeDecodeError) as exc:
        raise RetainedCorrupted(f"{path}: entry at byte {position}: {exc}") from exc
    if position != len(body):
        raise RetainedCorrupted(f"{path}: an entry runs past the end")
    return messages
