"""Which streams a vhost has, for `streamPattern`: names read from the definitions journal.

Owns the discovery of stream names. Stream directories are named by the sha1 of the
stream's name, so the names themselves come from the vhost's `definitions` journal (the
broker's record of durable queues: header b"SQDF", u16 version 1, u16 reserved, then
records `u32 length | u32 crc32c(payload) | payload`, each payload a JSON object with an
"op"). Replaying its "queue" and "queue.delete" ops gives the live queues; those declared
with `x-queue-type: stream` whose log directory exists are the streams.

Rules:
1. Read-only and lenient: the broker may be appending, so a torn or bad record ends the
   replay (what came before it stands). A missing or foreign file means no streams.
2. It never imports the broker (`streamq.broker`): a Spark executor does not need it.
"""

from __future__ import annotations

import json
import os
import re
import struct
from typing import Final

from spark_source.store import stream_directory
from streamq.log._records import crc32c

DEFINITIONS_FILE: Final = "definitions"
DEFINITIONS_MAGIC: Final = b"SQDF"
DEFINITIONS_VERSION: Final = 1
DEFINITIONS_BYTES_MAX: Final = 256 * 1024 * 1024  # far above any vhost's definitions
_HEADER: Final = struct.Struct("<4sHH")
_RECORD: Final = struct.Struct("<II")


def queue_names(definitions: bytes) -> dict[str, str]:
    """Live durable queues in a definitions journal: name -> x-queue-type ("" if unset)."""
    if len(definitions) < _HEADER.size:
        return {}
    magic, version, _ = _HEADER.unpack_from(definitions, 0)
    if magic != DEFINITIONS_MAGIC or version != DEFINITIONS_VERSION:
        return {}
    queues: dict[str, str] = {}
    position = _HEADER.size
    while position + _RECORD.size <= len(definitions):
        length, crc = _RECORD.unpack_from(definitions, position)
        start = position + _RECORD.size
        payload = definitions[start : start + length]
        if len(payload) < length or crc32c(payload) != crc:
            break  # a torn tail (or damage the broker will report): stop here
        try:
            op = json.loads(payload)
        except ValueError:
            break
        _apply(queues, op)
        position = start + length
    return queues


def _apply(queues: dict[str, str], op: object) -> None:
    if not isinstance(op, dict) or not isinstance(op.get("name"), str):
        return
    if op.get("op") == "queue":
        arguments = op.get("arguments")
        kind = arguments.get("x-queue-type") if isinstance(arguments, dict) else None
        queues[op["name"]] = kind if isinstance(kind, str) else ""
    elif op.get("op") == "queue.delete":
        queues.pop(op["name"], None)


def matching_streams(path: str, vhost: str, pattern: str) -> tuple[str, ...]:
    """The streams of `vhost` whose whole name matches the regex `pattern`, sorted.

    Raises OSError only for an unreadable journal; a missing one means no streams.
    """
    vhost_dir = os.path.dirname(os.path.dirname(stream_directory(path, vhost, "")))
    try:
        with open(os.path.join(vhost_dir, DEFINITIONS_FILE), "rb") as f:
            data = f.read(DEFINITIONS_BYTES_MAX)
    except FileNotFoundError:
        return ()
    regex = re.compile(pattern)
    return tuple(
        sorted(
            name
            for name, kind in queue_names(data).items()
            if kind == "stream"
            and regex.fullmatch(name)
            and os.path.isdir(stream_directory(path, vhost, name))
        )
    )
