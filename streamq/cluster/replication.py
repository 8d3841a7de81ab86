"""The replication wire protocol between a cluster leader and its followers.

Owns the bytes on the clustering port (5679): the handshake, the frame layout and the
encoding of every frame body, as pure functions, plus one bounded frame reader over an
asyncio stream. It decides nothing: the leader's side is `leader`, the follower's
`follower`, what a full sync compares is `sync`.

Handshake (follower -> leader unless noted), over TLS when the nodes have clustering
TLS settings (`link_tls`), else in clear text:
    "SQREPL" | u8 version (3; 2 from a node of before follower reads)
    leader -> follower: "SQREPL" | u8 version (the follower's): the greeting. The follower sends its
                   secret only once it has it, so that a clear-text follower that reached
                   a TLS leader (which answers its hello with a TLS alert, or closes)
                   never sends the secret, and says so.
    u8 secret length | secret (the etcd clustering_secret)
    leader -> follower: u8 0 (accepted) or 1 (refused; the leader then closes)
    u8 node id length | node id (utf-8)
A hello that starts with a TLS record (TLS_HANDSHAKE_RECORD) reaching a clear-text leader
is a TLS follower: refused, logged as such.

Then frames both ways, little-endian: u8 type | u32 body length | body (at most
FRAME_BODY_BYTES_MAX). Leader -> follower, in this order:
    FILE_ENTRIES   repeated: u8 kind (0 file, 1 directory) | u16 path length | path |
                   u64 size | 20-byte SHA-1 (files; zeros for directories)
    FILE_LIST_END  (empty): the leader's data directory is listed
    -- then one answer per FILE_REQUEST, in request order:
    FILE_BEGIN     u64 start | path: truncate the file to `start` (0: the whole file comes)
    FILE_DATA      u64 file position | bytes
    FILE_END       u64 size: the file is complete at this size
    FILE_MISSING   path: the leader no longer has it; remove it
    SYNC_END       u64 stream start | u64 stream position now: the live stream starts at
                   `start`; once the follower applied up to `now` its copy is consistent
    STREAM         u64 stream position | action bytes (`streamq.log.tap`'s encoding; a
                   frame may end inside an action)
    COMMITTED      u64 stream position (version 3 only): every round the leader recorded
                   up to there is on every in-sync replica and released (its confirms
                   went out). A follower serves stream reads only up to what its copy
                   held when it had received no more than that (`replica_log`).
Follower -> leader:
    FILE_REQUEST   u64 size | 20-byte SHA-1 of the follower's copy (size 0: none) | path
    REQUESTS_END   (empty): the follower asked for everything it lacks
    ACK            u64 stream position the follower applied and fsynced
"""

from __future__ import annotations

import asyncio
import struct
from typing import Final

MAGIC: Final = b"SQREPL"
VERSION: Final = 3
# A leader of this version also takes followers of version 2 (they get no COMMITTED
# frames), and a follower falls back to it for a leader of that version: rolling upgrades.
VERSIONS_ACCEPTED: Final = frozenset({2, 3})
VERSION_COMMITTED: Final = 3  # the first version with COMMITTED frames
ACCEPTED: Final = 0
REFUSED: Final = 1
SHA1_BYTES: Final = 20
NO_SHA1: Final = bytes(SHA1_BYTES)

# One frame's body: a stream read or a file chunk plus its small header.
FRAME_BODY_BYTES_MAX: Final = (4 << 20) + 64
HANDSHAKE_TIMEOUT_S: Final = 10.0
# The first byte of a TLS record: a handshake (ClientHello) or an alert.
TLS_HANDSHAKE_RECORD: Final = 0x16
TLS_ALERT_RECORD: Final = 0x15

FILE_ENTRIES: Final = 1
FILE_LIST_END: Final = 2
FILE_BEGIN: Final = 3
FILE_DATA: Final = 4
FILE_END: Final = 5
FILE_MISSING: Final = 6
SYNC_END: Final = 7
STREAM: Final = 8
COMMITTED: Final = 9
FILE_REQUEST: Final = 16
REQUESTS_END: Final = 17
ACK: Final = 18

ENTRY_FILE: Final = 0
ENTRY_DIRECTORY: Final = 1

_FRAME_HEAD: Final = struct.Struct("<BI")
_U64: Final = struct.Struct("<Q")
_TWO_U64: Final = struct.Struct("<QQ")
_ENTRY_HEAD: Final = struct.Struct("<BH")
_ENTRY_TAIL: Final = struct.Struct(f"<Q{SHA1_BYTES}s")
_REQUEST_HEAD: Final = struct.Struct(f"<Q{SHA1_BYTES}s")


class ReplicationError(Exception):
    """The replication connection failed or was refused; `reason` says why."""

    def __init__(self, reason: str, *, before_greeting: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        # The leader closed before greeting a hello of this version: try the older one.
        self.before_greeting = before_greeting


def frame(kind: int, body: bytes | bytearray | memoryview = b"") -> bytes:
    assert len(body) <= FRAME_BODY_BYTES_MAX
    return _FRAME_HEAD.pack(kind, len(body)) + bytes(body)


def frame_head(kind: int, body_length: int) -> bytes:
    """The header alone, for a body the caller writes after it without a copy."""
    assert body_length <= FRAME_BODY_BYTES_MAX
    return _FRAME_HEAD.pack(kind, body_length)


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """The next frame's (type, body). Raises ReplicationError at end of stream or on a
    body over FRAME_BODY_BYTES_MAX."""
    try:
        head = await reader.readexactly(_FRAME_HEAD.size)
        kind, length = _FRAME_HEAD.unpack(head)
        if length > FRAME_BODY_BYTES_MAX:
            raise ReplicationError(f"frame of {length} bytes is over the limit")
        return kind, await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        raise ReplicationError("connection closed by the peer") from None


def hello(version: int = VERSION) -> bytes:
    """The follower's first bytes, and the leader's greeting."""
    return MAGIC + bytes([version])


async def read_hello(reader: asyncio.StreamReader) -> int:
    """The leader reads a connecting follower's hello; returns its version. Raises
    ReplicationError on a TLS ClientHello (a TLS follower on a clear-text port), a bad
    magic or version, or a closed connection."""
    try:
        head = await reader.readexactly(len(MAGIC) + 1)
    except asyncio.IncompleteReadError:
        raise ReplicationError("connection closed during the handshake") from None
    if head[0] == TLS_HANDSHAKE_RECORD:
        raise ReplicationError(
            "the peer speaks TLS and this node's replication port is clear text: give "
            "every node the clustering TLS settings (clustering_tls_cert, _key, _ca), or none"
        )
    if head[: len(MAGIC)] != MAGIC or head[len(MAGIC)] not in VERSIONS_ACCEPTED:
        raise ReplicationError("not a streamq replication client of this version")
    return head[len(MAGIC)]


async def read_greeting(
    reader: asyncio.StreamReader, leader: str, *, tls: bool, version: int = VERSION
) -> None:
    """The follower reads the leader's greeting (`tls`: over TLS) to its hello of
    `version`. Raises ReplicationError if the leader answered as a TLS server (an alert),
    closed (`before_greeting` set: maybe a leader of version 2), or is not of that
    version."""
    try:
        head = await reader.readexactly(len(MAGIC) + 1)
    except asyncio.IncompleteReadError as exc:
        if exc.partial[:1] in (bytes([TLS_ALERT_RECORD]), bytes([TLS_HANDSHAKE_RECORD])):
            raise ReplicationError(_tls_leader(leader)) from None
        if tls:
            # TLS 1.3: the leader checks this node's certificate after our side of the
            # handshake is done, and closes if it refuses it.
            raise ReplicationError(
                f"the leader at {leader} closed the TLS connection before its greeting: it "
                "refused this node's certificate (not signed by its clustering_tls_ca?) or "
                "is of another version; the secret was not sent",
                before_greeting=True,
            ) from None
        raise ReplicationError(
            f"the leader at {leader} closed the connection before its greeting: its "
            "replication port may require TLS (this node has no clustering TLS settings) or "
            "be of another version; the secret was not sent",
            before_greeting=True,
        ) from None
    if head[0] in (TLS_ALERT_RECORD, TLS_HANDSHAKE_RECORD):
        raise ReplicationError(_tls_leader(leader))
    if head[: len(MAGIC)] != MAGIC or head[len(MAGIC)] != version:
        raise ReplicationError(f"the leader at {leader} is not a leader of this version")


def _tls_leader(leader: str) -> str:
    return (
        f"the leader at {leader} speaks TLS and this node has no clustering TLS settings "
        "(clustering_tls_cert, _key, _ca); the secret was not sent"
    )


def secret_bytes(secret: str) -> bytes:
    raw = secret.encode()
    assert len(raw) < 256
    return bytes([len(raw)]) + raw


async def read_secret(reader: asyncio.StreamReader) -> bytes:
    try:
        length = (await reader.readexactly(1))[0]
        return await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        raise ReplicationError("connection closed during the handshake") from None


def node_id_bytes(node_id: str) -> bytes:
    raw = node_id.encode()
    assert 0 < len(raw) < 256
    return bytes([len(raw)]) + raw


async def read_node_id(reader: asyncio.StreamReader) -> str:
    try:
        length = (await reader.readexactly(1))[0]
        raw = await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        raise ReplicationError("connection closed during the handshake") from None
    try:
        node_id = raw.decode()
    except UnicodeDecodeError:
        raise ReplicationError("node id is not utf-8") from None
    if not node_id:
        raise ReplicationError("empty node id")
    return node_id


def u64(value: int) -> bytes:
    return _U64.pack(value)


def parse_u64(body: bytes) -> int:
    if len(body) != _U64.size:
        raise ReplicationError(f"expected 8 bytes, got {len(body)}")
    value: int = _U64.unpack(body)[0]
    return value


def encode_entry(kind: int, path: str, size: int, sha1: bytes) -> bytes:
    name = path.encode()
    return _ENTRY_HEAD.pack(kind, len(name)) + name + _ENTRY_TAIL.pack(size, sha1)


def decode_entries(body: bytes) -> list[tuple[int, str, int, bytes]]:
    """(kind, path, size, sha1) of every entry of a FILE_ENTRIES body."""
    entries = []
    at = 0
    try:
        while at < len(body):
            kind, length = _ENTRY_HEAD.unpack_from(body, at)
            at += _ENTRY_HEAD.size
            path = body[at : at + length].decode()
            at += length
            size, sha1 = _ENTRY_TAIL.unpack_from(body, at)
            at += _ENTRY_TAIL.size
            if kind not in (ENTRY_FILE, ENTRY_DIRECTORY) or len(path.encode()) != length:
                raise ReplicationError(f"bad file entry for {path!r}")
            entries.append((kind, path, size, sha1))
    except (struct.error, UnicodeDecodeError):
        raise ReplicationError("truncated or undecodable file entry") from None
    return entries


def encode_request(path: str, size: int, sha1: bytes) -> bytes:
    return _REQUEST_HEAD.pack(size, sha1) + path.encode()


def decode_request(body: bytes) -> tuple[str, int, bytes]:
    """(path, size, sha1) of a FILE_REQUEST body."""
    if len(body) <= _REQUEST_HEAD.size:
        raise ReplicationError("truncated file request")
    size, sha1 = _REQUEST_HEAD.unpack_from(body)
    try:
        return body[_REQUEST_HEAD.size :].decode(), size, sha1
    except UnicodeDecodeError:
        raise ReplicationError("file request path is not utf-8") from None


def encode_positioned(position: int, path_or_data: bytes) -> bytes:
    """FILE_BEGIN, FILE_DATA and STREAM bodies: a u64 then bytes."""
    return _U64.pack(position) + path_or_data


def decode_positioned(body: bytes) -> tuple[int, bytes]:
    if len(body) < _U64.size:
        raise ReplicationError("truncated frame")
    position: int = _U64.unpack_from(body)[0]
    return position, body[_U64.size :]


def encode_sync_end(start: int, now: int) -> bytes:
    return _TWO_U64.pack(start, now)


def decode_sync_end(body: bytes) -> tuple[int, int]:
    if len(body) != _TWO_U64.size:
        raise ReplicationError("bad sync end frame")
    start, now = _TWO_U64.unpack(body)
    return int(start), int(now)
