"""Paging moves only durable bodies out of memory, oldest first, and reads them back
exactly; the order it keeps stays bounded by the messages still held."""

from __future__ import annotations

from pathlib import Path

import pytest

from amqp_gateway.deaths import AmqpPropertiesCodec
from streamq.broker.exchange import Destination
from streamq.broker.paging import MessageUnreadable, PagedMessage, Pager, body_size
from streamq.broker.queue import StoredMessage
from streamq.broker.vhost import VHost
from streamq.log.log import LogConfig, SegmentLog
from streamq.log.syncer import Syncer

NO_PROPERTIES = b"\x00\x00"  # AMQP basic properties with no flag set


@pytest.fixture
def log(tmp_path: Path):
    syncer = Syncer()
    opened = SegmentLog.open(str(tmp_path / "log"), syncer=syncer)
    yield opened
    opened.close_blocking()
    syncer.close()


def _publish(log: SegmentLog, pager: Pager, messages: dict[int, StoredMessage], body: bytes) -> int:
    offset = log.append_one(b"x", b"rk", b"", body, 1000)
    messages[offset] = StoredMessage(offset, "x", "rk", b"", body, 1, 1000)
    pager.resident_bytes += len(body)
    pager.order.append(offset)
    return offset


def test_pages_oldest_durable_bodies_down_to_the_low_mark(log: SegmentLog) -> None:
    pager = Pager(bytes_max=1000, bytes_low=500)
    messages: dict[int, StoredMessage] = {}
    offsets = [_publish(log, pager, messages, bytes([i]) * 100) for i in range(15)]
    assert pager.page_out(messages, log) == 0, "nothing is durable yet: nothing may go"
    log.sync_blocking()
    paged = pager.page_out(messages, log)
    assert paged == 10  # 1500 bytes resident, down to 500
    assert pager.resident_bytes == 500
    assert [isinstance(messages[o], PagedMessage) for o in offsets] == [True] * 10 + [False] * 5
    for i, offset in enumerate(offsets):
        assert messages[offset].body == bytes([i]) * 100
        assert body_size(messages[offset]) == 100
    assert pager.page_out(messages, log) == 0, "under the high mark: nothing more"


def test_the_order_is_trimmed_of_released_messages(log: SegmentLog) -> None:
    pager = Pager(bytes_max=10**9, bytes_low=10**9)
    messages: dict[int, StoredMessage] = {}
    stuck = _publish(log, pager, messages, b"held")
    for _ in range(10_000):
        offset = _publish(log, pager, messages, b"gone")
        del messages[offset]
        pager.resident_bytes -= 4
    pager.page_out(messages, log)
    assert list(pager.order) == [stuck], "stale offsets behind a held one are compacted"


def test_a_body_missing_from_the_log_is_unreadable(log: SegmentLog) -> None:
    stored = StoredMessage(12345, "x", "rk", b"", b"body", 1, 1000)
    paged = PagedMessage(stored, 4, log)
    with pytest.raises(MessageUnreadable, match="offset 12345"):
        _ = paged.body
    with pytest.raises(AttributeError, match="lives in the log"):
        paged.body = b"other"


def _damaged_paged_vhost(tmp_path: Path):
    """A vhost whose queue "q" (dead-lettering to "dead") holds paged messages in a
    sealed segment whose bytes were then damaged on disk."""
    vhost = VHost("/", str(tmp_path / "vhost"), Syncer())
    vhost.log.close_blocking()
    log_dir = tmp_path / "small"
    vhost.log = SegmentLog.open(str(log_dir), LogConfig(segment_bytes_max=4096))
    vhost.properties_codec = AmqpPropertiesCodec()
    vhost.pager = Pager(bytes_max=0, bytes_low=0)
    owner = object()
    vhost.declare_exchange("dlx", "fanout", False, True, False, False, {})
    dead = vhost.declare_queue("dead", False, True, False, False, {}, owner)
    vhost.bind(Destination("queue", "dead"), "dlx", "", {})
    queue = vhost.declare_queue(
        "q", False, True, False, False, {"x-dead-letter-exchange": "dlx"}, owner
    )
    for i in range(100):
        vhost.publish("", "q", NO_PROPERTIES, bytes([i]) * 100, vhost.route("", "q", None))
    vhost.log.sync_blocking()
    assert vhost.page_out() == 100
    first = min(log_dir.glob("*.seg"))
    data = bytearray(first.read_bytes())
    data[-50] ^= 0xFF  # inside the last record of the first (sealed) segment
    first.write_bytes(bytes(data))
    return vhost, queue, dead


def test_an_unreadable_paged_message_fails_its_queue_when_dead_lettered(tmp_path: Path) -> None:
    vhost, queue, dead = _damaged_paged_vhost(tmp_path)
    while (ready := queue.cursor.take()) is not None and queue.failed is None:
        vhost.reject(queue, ready.offset)
    assert queue.failed is not None and "offset" in queue.failed
    assert 0 < dead.cursor.message_count < 100, "those before the damage went on"
    vhost.close()
