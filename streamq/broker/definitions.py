"""A vhost's durable definitions journal: exchanges, queues and bindings that survive a restart.

Owns the file `definitions` in a vhost directory. Every change to a durable entity is
appended as one record; start-up replays them in order, then rewrites the file as a
snapshot of what is live (write temp, fsync, rename, fsync directory) when it holds more
than that. It stores changes, not commands: replay applies them without side effects
(no auto-delete cascades, no routing), so it cannot diverge from what was acknowledged.

File layout (little-endian): header magic b"SQDF" | u16 version (1) | u16 reserved, then
records `u32 length | u32 crc32c(payload) | payload`, the payload a UTF-8 JSON object
with an "op" key: "exchange" / "exchange.delete", "queue" / "queue.delete", "bind" /
"unbind". A torn last record is cut off; a bad record followed by good ones raises
DefinitionsCorrupted.

Durability: `record` is buffered; `prepare_sync` writes the buffer to the OS, and the vhost
log's sync round (this journal is one of its sync companions) fdatasyncs it. A Declare-Ok
waits for such a round.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import struct
from collections.abc import Mapping
from decimal import Decimal
from typing import Final

from streamq.broker.errors import BrokerError
from streamq.log import files
from streamq.log._records import crc32c
from streamq.log.errors import OutOfSpace
from streamq.log.files import append_all, write_file_atomic
from streamq.log.versions import refuse_newer

logger = logging.getLogger(__name__)

MAGIC: Final = b"SQDF"
VERSION: Final = 1
HEADER: Final = struct.Struct("<4sHH")
RECORD_HEADER: Final = struct.Struct("<II")
RECORD_BYTES_MAX: Final = 16 * 1024 * 1024  # one definition; arguments are small
# Rewrite the file at start-up when it holds this many more records than live entities.
COMPACT_SLACK_RECORDS: Final = 256

Op = dict[str, object]


class DefinitionsCorrupted(BrokerError):
    def __init__(self, path: str, position: int, reason: str) -> None:
        super().__init__(f"definitions file {path} is corrupt at byte {position}: {reason}")
        self.path = path


def encode_record(op: Op) -> bytes:
    text = json.dumps(op, separators=(",", ":"), ensure_ascii=False)
    try:
        payload = text.encode()
    except UnicodeEncodeError:
        # A name, key or argument from AMQP with octets that are not UTF-8 (kept as
        # surrogateescape, as RabbitMQ keeps any binary): escaped as \udcXX, which
        # json.loads reads back to the same string. Found by fuzzing (docs/fuzzing.md).
        payload = json.dumps(op, separators=(",", ":")).encode()
    return RECORD_HEADER.pack(len(payload), crc32c(payload)) + payload


def encode_file(ops: list[Op]) -> bytes:
    return HEADER.pack(MAGIC, VERSION, 0) + b"".join(encode_record(op) for op in ops)


def decode_file(path: str, data: bytes) -> tuple[list[Op], int]:
    """The records of a definitions file and the length of its valid part."""
    if len(data) < HEADER.size:
        return [], 0
    magic, version, _ = HEADER.unpack_from(data, 0)
    if magic == MAGIC:
        refuse_newer(path, "definitions", version, VERSION)
    if magic != MAGIC or version != VERSION:
        raise DefinitionsCorrupted(path, 0, f"bad header {magic!r} version {version}")
    ops: list[Op] = []
    position = HEADER.size
    while position + RECORD_HEADER.size <= len(data):
        length, crc = RECORD_HEADER.unpack_from(data, position)
        start = position + RECORD_HEADER.size
        payload = data[start : start + length]
        if length > RECORD_BYTES_MAX or len(payload) < length or crc32c(payload) != crc:
            if start + length < len(data) and length <= RECORD_BYTES_MAX:
                raise DefinitionsCorrupted(path, position, "record fails its checksum")
            break  # torn last record
        try:
            op = json.loads(payload)
        except ValueError as exc:
            raise DefinitionsCorrupted(path, position, f"bad record: {exc}") from exc
        if not isinstance(op, dict) or not isinstance(op.get("op"), str):
            raise DefinitionsCorrupted(path, position, "record without an op")
        ops.append(op)
        position = start + length
    return ops, position


def _cut_torn_tail(path: str, valid_bytes: int) -> None:
    """A full disk at start-up: cut the torn tail off in place (which needs no room)
    rather than rewriting the file, with a log line."""
    fd = files.open_fd(path, os.O_WRONLY)
    try:
        files.ftruncate(fd, valid_bytes)
        os.fsync(fd)
    finally:
        files.close_fd(fd)
    logger.warning("definitions %s: no room to rewrite it; torn tail cut in place", path)


class DefinitionsJournal:
    """The open definitions file of one vhost; event-loop thread only."""

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self._fd = fd
        self._buffer = bytearray()

    @classmethod
    def open(cls, path: str) -> tuple[DefinitionsJournal, list[Op]]:
        """Open (or create) the file and return its records in order. A torn tail is cut
        off (fsyncs before returning). Raises DefinitionsCorrupted and OSError."""
        try:
            with open(path, "rb") as file:
                data = file.read()
        except FileNotFoundError:
            data = b""
        ops, valid = decode_file(path, data)
        if valid != len(data) or not data:
            try:
                write_file_atomic(path, encode_file(ops), fsync_dir=True)
            except OutOfSpace:
                if valid < HEADER.size:
                    raise  # no file to keep: the vhost cannot start without room
                _cut_torn_tail(path, valid)
        fd = files.open_fd(path, os.O_WRONLY | os.O_APPEND)
        return cls(path, fd), ops

    def replace(self, ops: list[Op]) -> None:
        """Start-up compaction: the file becomes exactly `ops`. Fsyncs file and directory
        before returning. On a full disk the file stays as it is (its records give the
        same definitions), with a log line; the next start-up compacts it."""
        try:
            write_file_atomic(self.path, encode_file(ops), fsync_dir=True)
        except OutOfSpace as exc:
            logger.warning("definitions %s: not compacted at start-up: %s", self.path, exc)
            return
        files.close_fd(self._fd)
        self._fd = files.open_fd(self.path, os.O_WRONLY | os.O_APPEND)

    def record(self, op: Op) -> None:
        """Buffered: durable after the next sync round that includes companions."""
        self._buffer += encode_record(op)

    @property
    def dirty(self) -> bool:
        return bool(self._buffer)

    def prepare_sync(self) -> int:
        """Write the buffered records (durable after the round's fdatasync of the returned
        descriptor). Raises OutOfSpace, keeping the records for the next round, when the
        file system has no room (the file is cut back to its last whole record)."""
        if self._buffer:
            append_all(self._fd, self._buffer)
            self._buffer.clear()
        return self._fd

    def close(self) -> None:
        if self._fd >= 0:
            files.close_fd(self._fd)
            self._fd = -1


# -- argument values ----------------------------------------------------------------------
# Queue and exchange arguments are AMQP field values. JSON keeps their values; the wire
# subtype of an integer (int8 ... int64, timestamp) is not kept, which RabbitMQ does not
# keep either: equivalence checks compare values.


def arguments_to_json(arguments: Mapping[str, object]) -> dict[str, object]:
    return {key: _value_to_json(value) for key, value in arguments.items()}


def _value_to_json(value: object) -> object:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, Decimal):
        return {"$decimal": str(value)}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$bytes": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, Mapping):
        return {"$table": {str(k): _value_to_json(v) for k, v in value.items()}}
    if isinstance(value, (list, tuple)):
        return [_value_to_json(v) for v in value]
    raise TypeError(f"cannot store argument value {value!r}")


def arguments_from_json(stored: object) -> dict[str, object]:
    if not isinstance(stored, dict):
        return {}
    return {str(key): _value_from_json(value) for key, value in stored.items()}


def _value_from_json(value: object) -> object:
    if isinstance(value, list):
        return [_value_from_json(v) for v in value]
    if isinstance(value, dict):
        if "$decimal" in value:
            return Decimal(str(value["$decimal"]))
        if "$bytes" in value:
            return base64.b64decode(str(value["$bytes"]))
        return arguments_from_json(value.get("$table", {}))
    return value
