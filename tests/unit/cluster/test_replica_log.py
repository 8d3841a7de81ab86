"""A follower's view of a stream directory (`ReplicaLog`) against the leader's own reads.

A real stream log is written by `StreamQueue` (as the leader's broker writes it); the
replica reads the same directory with a `ReplicaProgress` driven by hand, as the
replication client would. Checked: nothing is readable until a COMMITTED position
covers the bytes received when the marker was read (the follower's commit rule), then
exactly what the leader's reads give, chunk by chunk, across segments (a stream in
format version 1, chunks built at read time, and in version 2, stored chunks); a new
connection (epoch) forgets uncovered marker reads; a full sync (not readable) freezes
the end; offset specifications; retention removing the first segment; and the
follower's stream port applying the loopback rule."""

from __future__ import annotations

import os
import struct

import pytest

from retention.rules import RetentionRules
from stream_gateway.codec import commands as c
from stream_gateway.codec import decode, encode
from stream_gateway.codec.constants import OffsetType, ResponseCode
from streamq.cluster.replica_log import ReplicaLog
from streamq.cluster.replica_progress import ReplicaProgress
from streamq.cluster.stream_proxy import _start_offset, loopback_refusal
from streamq.log.config import LogConfig
from streamq.log.errors import OffsetOutOfRange
from streamq.log.log import SegmentLog
from streamq.queues.chunks import Chunk, read_chunk
from streamq.queues.offsets import OffsetStore
from streamq.queues.stored_chunks import read_stored_chunk
from streamq.queues.stream import StreamQueue
from tests.unit.queues.test_stream_native import close

PUBLISH_BATCH = 50


def publish(stream: StreamQueue, first_id: int, count: int) -> None:
    """`count` messages, in Publish frames of up to PUBLISH_BATCH, each one synced (a
    round: in format version 2, a chunk, which never spans segments)."""
    for start in range(0, count, PUBLISH_BATCH):
        n_max = min(PUBLISH_BATCH, count - start)
        body = b"".join(
            struct.pack(">QI", first_id + start + n, 20) + b"message %012d" % (start + n)
            for n in range(n_max)
        )
        stream.append_publish(b"", 1, struct.pack(">i", n_max) + body, 1_000 + first_id + start)
        stream.log.sync_blocking()


@pytest.fixture(params=[1, 2], ids=["format-1", "format-2"])
def stream(tmp_path: str, request: pytest.FixtureRequest) -> StreamQueue:
    config = LogConfig(segment_bytes_max=2048, format_version=request.param)
    log = SegmentLog.open(os.path.join(str(tmp_path), "log"), config)
    opened = StreamQueue(
        log, RetentionRules(), OffsetStore.open(os.path.join(str(tmp_path), "off"))
    )
    yield opened
    close(opened)


def replica_of(stream: StreamQueue) -> tuple[ReplicaLog, ReplicaProgress]:
    progress = ReplicaProgress()
    progress.connected(100)
    progress.consistent()
    return ReplicaLog(stream.log.directory, progress), progress


def one_chunk(log: object, offset: int) -> Chunk | None:
    """The chunk from `offset` as the leader's `StreamQueue.read_chunk` and the
    follower's `stream_proxy` read it: stored (version 2) or built (version 1)."""
    offset = max(offset, log.start_offset)  # type: ignore[attr-defined]
    place = log.chunk_at(offset)  # type: ignore[attr-defined]
    if place is not None:
        return read_stored_chunk(log, place, offset, None)  # type: ignore[arg-type]
    return read_chunk(log, offset, 50, 1 << 20)  # type: ignore[arg-type]


def chunks(log: object, offset: int) -> list[bytes]:
    out = []
    while (chunk := one_chunk(log, offset)) is not None:
        out.append(bytes(chunk.data))
        offset = chunk.next_offset
    return out


def test_only_what_a_commit_covers_is_read_then_the_leaders_chunks(stream: StreamQueue) -> None:
    publish(stream, 1, 300)
    replica, progress = replica_of(stream)
    progress.received = 500
    replica.refresh()  # the marker (300) read with 500 bytes received
    assert (replica.known, replica.end) == (False, 0)
    progress.commit(499)
    replica.refresh()
    assert (replica.known, replica.end) == (False, 0)  # 499 does not cover 500
    progress.commit(500)
    replica.refresh()
    assert (replica.known, replica.end) == (True, 300)
    assert len(stream.log.segments()) > 2  # the read crosses segments
    assert chunks(replica, 0) == chunks(stream.log, 0) != []
    assert chunks(replica, 123) == chunks(stream.log, 123)
    # More records: not readable until covered, even though they are on the disk.
    publish(stream, 301, 50)
    progress.received = 900
    replica.refresh()
    assert replica.end == 300
    assert one_chunk(replica, 300) is None
    progress.commit(900)
    replica.refresh()
    assert replica.end == 350
    assert chunks(replica, 290) == chunks(stream.log, 290)


def test_a_new_connection_forgets_reads_in_the_old_ones_positions(stream: StreamQueue) -> None:
    publish(stream, 1, 10)
    replica, progress = replica_of(stream)
    progress.received = 5_000
    replica.refresh()
    progress.connected(10)  # a new leader: small positions, the old read means nothing
    progress.consistent()
    progress.commit(4_999)
    replica.refresh()  # read again with 10 received: covered
    assert replica.end == 10
    progress.stopped()  # a full sync: files may change, nothing moves
    publish(stream, 11, 10)
    progress.commit(1 << 40)
    assert replica.refresh() is False and replica.end == 10


def test_offset_specifications_and_retention(stream: StreamQueue) -> None:
    publish(stream, 1, 300)
    replica, progress = replica_of(stream)
    progress.commit(100)
    replica.refresh()
    spec = c.OffsetSpec
    assert _start_offset(replica, spec(OffsetType.FIRST)) == 0
    assert _start_offset(replica, spec(OffsetType.NEXT)) == 300
    assert _start_offset(replica, spec(OffsetType.LAST)) == 299
    assert _start_offset(replica, spec(OffsetType.OFFSET, 120)) == 120
    assert _start_offset(replica, spec(OffsetType.OFFSET, 9_999)) == 300
    assert _start_offset(replica, spec(OffsetType.TIMESTAMP, 0)) == 0
    # The frame from 100 was appended at 1_101, the one before at 1_051.
    assert _start_offset(replica, spec(OffsetType.TIMESTAMP, 1_100)) == 100
    assert _start_offset(replica, spec(OffsetType.TIMESTAMP, 1 << 60)) == 300
    # Retention removes the first segment after a replica listed it (a segment already
    # open stays readable, as on the leader): the read fails, and the next listing
    # starts at the second segment.
    fresh, fresh_progress = replica_of(stream)
    fresh_progress.commit(100)
    fresh.refresh()
    first, second = (s.base_offset for s in stream.log.segments()[:2])
    os.remove(os.path.join(stream.log.directory, f"{first:020d}.seg"))
    with pytest.raises(OffsetOutOfRange):
        one_chunk(fresh, 0)
    fresh.refresh(relist=True)
    chunk = one_chunk(fresh, 0)
    assert chunk is not None and chunk.first_offset == second


def test_a_follower_refuses_guest_from_a_remote_address_as_the_leader_would() -> None:
    """The leader sees the follower's address (no PROXY header on the stream port), so
    the follower applies the loopback rule itself, for PLAIN and AMQPLAIN alike."""
    plain = encode(c.SaslAuthenticate(3, "PLAIN", b"\x00guest\x00guest"))
    refused = c.SaslAuthenticateResponse(3, ResponseCode.SASL_AUTHENTICATION_FAILURE_LOOPBACK)
    assert loopback_refusal("10.0.0.5", plain) == encode(refused)
    assert loopback_refusal("127.0.0.1", plain) is None
    assert loopback_refusal("::1", plain) is None
    other = encode(c.SaslAuthenticate(4, "PLAIN", b"\x00alice\x00secret"))
    assert loopback_refusal("10.0.0.5", other) is None
    table = b"\x05LOGINS" + struct.pack(">I", 5) + b"guest"
    table += b"\x08PASSWORDS" + struct.pack(">I", 5) + b"guest"
    amqplain = encode(c.SaslAuthenticate(5, "AMQPLAIN", table))
    answer = decode(memoryview(loopback_refusal("10.0.0.5", amqplain) or b"")[4:])
    assert answer == c.SaslAuthenticateResponse(
        5, ResponseCode.SASL_AUTHENTICATION_FAILURE_LOOPBACK
    )
