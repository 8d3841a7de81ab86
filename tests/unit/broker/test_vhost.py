"""The vhost: routing through exchanges, and the shared log's segments collected once no
queue needs them."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamq.broker.errors import AccessRefused, NotFound, PreconditionFailed
from streamq.broker.exchange import Destination, topic_match, topic_words
from streamq.broker.vhost import VHost
from streamq.log.log import LogConfig, SegmentLog
from streamq.log.syncer import Syncer


@pytest.fixture
def vhost(tmp_path: Path) -> VHost:
    host = VHost("/", str(tmp_path), Syncer())
    host.log.close_blocking()
    host.log = SegmentLog.open(str(tmp_path / "small"), LogConfig(segment_bytes_max=4096))
    return host


def test_segments_are_collected_when_no_queue_needs_them(vhost: VHost) -> None:
    queue = vhost.declare_queue("q", False, True, False, False, {}, owner=object())
    other = vhost.declare_queue("other", False, True, False, False, {}, owner=object())
    for _ in range(200):
        vhost.publish("", "q", b"", b"x" * 100, vhost.route("", "q", None))
    vhost.publish("", "other", b"", b"kept", vhost.route("", "other", None))
    vhost.log.sync_blocking()
    segments = len(vhost.log.segments())
    assert segments > 4
    assert vhost.collect_segments() == 0  # q still holds everything
    while (ready := queue.cursor.take()) is not None:
        vhost.settle(queue, ready.offset)
    assert vhost.collect_segments() == segments - 1  # all but the active one
    assert other.cursor.low_water_offset() == 200
    assert vhost.log.start_offset <= 200
    assert vhost.messages.keys() == {200}


def test_routing_follows_exchange_bindings_and_the_alternate_exchange(vhost: VHost) -> None:
    owner = object()
    vhost.declare_queue("unrouted", False, True, False, False, {}, owner)
    vhost.declare_queue("t", False, True, False, False, {}, owner)
    vhost.declare_exchange("ae", "fanout", False, True, False, False, {})
    vhost.declare_exchange("main", "topic", False, True, False, False, {"alternate-exchange": "ae"})
    vhost.bind(Destination("queue", "unrouted"), "ae", "", {})
    vhost.bind(Destination("queue", "t"), "main", "a.*", {})
    assert [q.name for q in vhost.route("main", "a.b", None)] == ["t"]
    assert [q.name for q in vhost.route("main", "zzz", None)] == ["unrouted"]
    with pytest.raises(NotFound, match="no exchange 'none' in vhost '/'"):
        vhost.route("none", "k", None)
    with pytest.raises(AccessRefused):
        vhost.bind(Destination("queue", "t"), "", "k", {})
    with pytest.raises(PreconditionFailed, match="inequivalent arg 'type'"):
        vhost.declare_exchange("main", "direct", False, True, False, False, {})


@pytest.mark.parametrize(
    ("pattern", "key", "matches"),
    [
        ("#", "", True),
        ("#", "a.b", True),
        ("a.#", "a", True),
        ("#.b", "b", True),
        ("a.#.b", "a.b", True),
        ("a.#.b", "a.x.y.b", True),
        ("a.*", "a", False),
        ("a.*", "a.b.c", False),
        ("*.*", "a..", False),
        ("*", "", False),  # the empty key is no word (see test_topic_routing.py)
        ("a..b", "a..b", True),
        ("a.*.b", "a..b", True),
    ],
)
def test_topic_matching(pattern: str, key: str, matches: bool) -> None:
    assert topic_match(topic_words(pattern), topic_words(key)) is matches


def test_each_drain_drops_the_paging_order_of_settled_messages(vhost: VHost) -> None:
    """The pager's order loses consumed messages drain by drain, not all at once in the
    housekeeping; an offset still held stops the trim."""
    queue = vhost.declare_queue("q", False, True, False, False, {}, owner=object())
    for _ in range(50):
        vhost.publish("", "q", b"", b"body", vhost.route("", "q", None))
    assert len(vhost.pager.order) == 50
    first = queue.cursor.take()
    assert first is not None
    for _ in range(29):
        ready = queue.cursor.take()
        assert ready is not None
        vhost.settle(queue, ready.offset)
    vhost.drain()
    assert len(vhost.pager.order) == 50, "the first message is still held"
    vhost.settle(queue, first.offset)
    vhost.drain()
    assert list(vhost.pager.order) == list(range(30, 50))
