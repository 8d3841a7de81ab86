"""The vhost: routing through exchanges, and the shared log's segments collected once no
queue needs them."""

from __future__ import annotations

from pathlib import Path

import pytest

from amqp_gateway.codec import BasicProperties, decode_properties, encode_properties
from amqp_gateway.deaths import AmqpPropertiesCodec
from streamq.broker import vhost_store
from streamq.broker.errors import AccessRefused, NotFound, PreconditionFailed
from streamq.broker.exchange import Destination, topic_match, topic_words
from streamq.broker.vhost import VHost
from streamq.log.log import LogConfig
from streamq.log.syncer import Syncer
from tests.unit.broker.consumers import RecordingConsumer

PLAIN = encode_properties(BasicProperties())


@pytest.fixture
def vhost(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> VHost:
    # Small segments, so that a few messages fill several.
    monkeypatch.setattr(vhost_store, "MESSAGE_LOG_CONFIG", LogConfig(segment_bytes_max=4096))
    return VHost("/", str(tmp_path), Syncer())


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
    while (taken := vhost.get(queue, 0)) is not None:
        vhost.settle(queue, taken[0].offset)
    assert vhost.collect_segments() == segments - 1  # all but the active one
    assert other.cursor.low_water_offset() == 200
    assert vhost.log.start_offset <= 200
    assert vhost.log.read_record(200).body == b"kept"


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


def test_a_consumer_gets_a_deep_queue_in_runs_read_back_across_segments(
    vhost: VHost,
) -> None:
    """A classic queue holds offsets only: its messages are read back from the log's
    segments (here 4 KiB each, so a run crosses many) and delivered in runs, in order and
    intact, whether durable yet or still in the log's buffers."""
    queue = vhost.declare_queue("q", False, True, False, False, {}, owner=object())
    other = vhost.declare_queue("other", False, True, False, False, {}, owner=object())
    bodies = []
    for n in range(300):
        body = f"{n:05d}".encode() * (n % 37)
        bodies.append(body)
        vhost.publish("", "q", b"\x00\x00", body, vhost.route("", "q", None))
        if n % 7 == 0:  # other offsets in between: the runs have gaps
            vhost.publish("", "other", b"\x00\x00", b"gap", vhost.route("", "other", None))
    vhost.log.sync_blocking()
    for n in range(300, 320):  # appended, not durable yet
        body = f"{n:05d}".encode()
        bodies.append(body)
        vhost.publish("", "q", b"\x00\x00", body, vhost.route("", "q", None))
    assert len(vhost.log.segments()) > 5
    gaps = len(range(0, 300, 7))  # a gap after each of them
    assert queue.cursor.run_count == gaps + 1
    assert other.cursor.message_count == gaps
    consumer = RecordingConsumer(prefetch=0)
    vhost.add_consumer(queue, consumer)
    vhost.drain()
    assert consumer.bodies == bodies
    assert max(consumer.runs) > 1
    assert queue.cursor.message_count == 0 and queue.cursor.unacked_count == 320
    assert queue.cursor.bytes_unacked == sum(map(len, bodies))
    vhost.settle_classic(queue, list(consumer.unacked))
    assert queue.cursor.low_water_offset() is None


def test_a_queue_ttl_delivers_runs_and_still_expires_its_head(tmp_path: Path) -> None:
    """With a queue TTL and no message expiration of its own, unexpired messages go out
    in runs (timestamps never decrease along the log, so a run whose first message has
    not expired has none that has); an expired head is dead-lettered one by one first."""
    host = VHost("/", str(tmp_path / "vh"), Syncer())
    host.properties_codec = AmqpPropertiesCodec()
    try:
        host.declare_queue("dlq", False, True, False, False, {}, owner=None)
        arguments = {
            "x-message-ttl": 60_000,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "dlq",
        }
        queue = host.declare_queue("q", False, True, False, False, arguments, owner=None)
        old_ms, new_ms = 1_000, 10**13  # published long ago, and in the far future
        for n in range(50):
            host.publish("", "q", PLAIN, b"old%d" % n, [queue], old_ms)
        for n in range(500):
            host.publish("", "q", PLAIN, b"new%d" % n, [queue], new_ms)
        consumer = RecordingConsumer(prefetch=0)
        host.add_consumer(queue, consumer)
        host.drain()
        assert consumer.bodies == [b"new%d" % n for n in range(500)]
        assert max(consumer.runs) > 100  # not one at a time
        dead = host.queues["dlq"]
        assert dead.cursor.message_count == 50
        taken = host.get(dead, 0)
        assert taken is not None and taken[1].body == b"old0"
    finally:
        host.close()


def test_an_expired_head_is_dead_lettered_in_runs_in_order(tmp_path: Path) -> None:
    """A queue TTL's expired head goes as runs: read in order, dead-lettered with one
    x-death splice per stretch of equal properties (published as one run), settled as
    one journal entry; messages not yet expired stay, and so does their byte count."""
    host = VHost("/", str(tmp_path / "vh"), Syncer())
    host.properties_codec = AmqpPropertiesCodec()
    try:
        host.declare_queue("dlq", False, True, False, False, {}, owner=None)
        arguments = {"x-message-ttl": 1000, "x-dead-letter-exchange": ""}
        arguments["x-dead-letter-routing-key"] = "dlq"
        queue = host.declare_queue("q", False, True, False, False, arguments, owner=None)
        other = encode_properties(BasicProperties(content_type="text/plain"))
        for n in range(5000):  # past EXPIRE_RUN_MAX; properties change at 3000
            host.publish("", "q", PLAIN if n < 3000 else other, b"%d" % n, [queue], 1_000)
        for n in range(3):
            host.publish("", "q", PLAIN, b"late%d" % n, [queue], 10_000)
        assert host.expire_head(queue, 5_000) == 5000
        assert queue.cursor.message_count == 3
        assert queue.cursor.bytes_ready == len(b"late0") * 3
        dead = host.queues["dlq"]
        bodies, content_types, deaths = [], set(), set()
        codec = AmqpPropertiesCodec()
        while (taken := host.get(dead, 0)) is not None:
            ready, record = taken
            bodies.append(record.body)
            content_types.add(decode_properties(record.properties).content_type)
            deaths.add(tuple(codec.deaths(record.properties)))
            host.settle(dead, ready.offset)
        assert bodies == [b"%d" % n for n in range(5000)]
        assert content_types == {None, "text/plain"}
        assert deaths == {(("q", "expired"),)}
    finally:
        host.close()
