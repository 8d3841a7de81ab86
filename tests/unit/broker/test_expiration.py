"""Per-message expirations (`streamq.broker.expiration`): the `expiration` property read
without decoding, checked against the full properties decoder; and the bound a queue
keeps on its messages' own deadlines (`Queue.own_expiry_min_ms`), which lets runs of
never-delivered messages go out whole while nothing can have expired, and must never
let an expired message out. The vhost is driven directly with recording consumers."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amqp_gateway.codec import BasicProperties, decode_properties, encode_properties
from amqp_gateway.deaths import AmqpPropertiesCodec
from streamq.broker.expiration import EXPIRY_NONE, EXPIRY_UNKNOWN, deadline_ms, expiration_ms
from streamq.broker.queue import Queue
from streamq.broker.vhost import VHost
from streamq.log.syncer import Syncer
from tests.unit.broker.consumers import RecordingConsumer

short = st.text(st.characters(codec="utf-8"), max_size=20)
expirations = st.one_of(
    st.none(),
    st.integers(0, 10**10).map(str),
    st.sampled_from(["+5", "007", "-1", "", "5x", "x", " 5", "+-5", "1_0", "٣"]),
)


@given(
    content_type=st.one_of(st.none(), short),
    content_encoding=st.one_of(st.none(), short),
    headers=st.one_of(st.none(), st.dictionaries(short, short, max_size=3)),
    delivery_mode=st.one_of(st.none(), st.integers(1, 2)),
    priority=st.one_of(st.none(), st.integers(0, 255)),
    correlation_id=st.one_of(st.none(), short),
    reply_to=st.one_of(st.none(), short),
    expiration=expirations,
    message_id=st.one_of(st.none(), short),
)
def test_the_expiration_read_without_decoding_is_the_decoders(**fields: object) -> None:
    raw = encode_properties(BasicProperties(**fields))  # type: ignore[arg-type]
    decoded = decode_properties(raw).expiration
    expected = AmqpPropertiesCodec().expiration_ms(raw)
    got = expiration_ms(raw)
    if decoded is None:
        assert got is None
    elif expected is not None:
        assert got == expected  # what the broker's expiry check uses
    else:
        # Refused at publish (out of bounds, or not an integer): never stored as
        # written. Read or not, it is never a later deadline than its digits say.
        assert got is None or got == int(decoded)


def test_a_short_or_unreadable_expiration_gives_an_unknown_deadline() -> None:
    assert expiration_ms(b"") is None and expiration_ms(b"\x01") is None
    assert expiration_ms(b"\x01\x00\x05ab") is None  # shorter than its length says
    raw = encode_properties(BasicProperties(expiration="soon"))
    assert deadline_ms(raw, 1000) == EXPIRY_UNKNOWN
    assert deadline_ms(encode_properties(BasicProperties(expiration="250")), 1000) == 1250


@pytest.fixture
def vhost(tmp_path: Path):  # type: ignore[no-untyped-def]
    host = VHost("/", str(tmp_path), Syncer())
    host.properties_codec = AmqpPropertiesCodec()
    yield host
    host.close()


def expiring(ms: int) -> bytes:
    return encode_properties(BasicProperties(expiration=str(ms)))


def declare(vhost: VHost) -> Queue:
    vhost.declare_queue("dlq", False, True, False, False, {}, owner=None)
    dead = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"}
    return vhost.declare_queue("q", False, True, False, False, dead, owner=None)


def test_publishes_lower_the_bound_and_an_emptied_queue_resets_it(vhost: VHost) -> None:
    queue = declare(vhost)
    assert queue.own_expiry_min_ms == EXPIRY_NONE
    before_ms = int(time.time() * 1000)
    vhost.publish("", "q", expiring(600_000), b"a", [queue])
    bound = queue.own_expiry_min_ms
    assert before_ms + 600_000 <= bound <= int(time.time() * 1000) + 600_000
    vhost.publish("", "q", expiring(900_000), b"b", [queue])
    assert queue.own_expiry_min_ms == bound  # a later deadline does not raise it
    run = [(expiring(300_000), b"c"), (encode_properties(BasicProperties()), b"d")]
    vhost.publish_run("", "q", run, [queue], before_ms)  # type: ignore[arg-type]
    assert queue.own_expiry_min_ms == before_ms + 300_000
    consumer = RecordingConsumer(0)
    vhost.add_consumer(queue, consumer)
    vhost.drain()
    assert consumer.bodies == [b"a", b"b", b"c", b"d"]
    assert queue.own_expiry_min_ms == EXPIRY_NONE


def test_runs_go_whole_before_the_bound_and_stop_at_expired_ones_after_it(
    vhost: VHost,
) -> None:
    queue = declare(vhost)
    for n in range(200):  # queued before any consumer: not offered on arrival
        vhost.publish("", "q", expiring(600_000), b"%d" % n, [queue])
    consumer = RecordingConsumer(0)
    vhost.add_consumer(queue, consumer)
    vhost.drain()
    assert len(consumer.bodies) == 200 and len(consumer.runs) <= 2  # in runs, not singly
    vhost.remove_consumer(queue, consumer)
    for n in range(10):  # a short expiration among long ones lowers the bound
        vhost.publish("", "q", expiring(1 if n == 4 else 600_000), b"late%d" % n, [queue])
    time.sleep(0.01)
    second = RecordingConsumer(0, "second")
    vhost.add_consumer(queue, second)
    vhost.drain()
    assert second.bodies == [b"late%d" % n for n in range(10) if n != 4]
    assert vhost.queues["dlq"].message_count == 1


def test_a_restored_queue_checks_each_message_until_it_empties(tmp_path: Path) -> None:
    syncer = Syncer()
    host = VHost("/", str(tmp_path), syncer)
    host.properties_codec = AmqpPropertiesCodec()
    queue = declare(host)
    host.publish("", "q", expiring(600_000), b"kept", [queue])
    host.close()  # a clean close: what was published is on disk
    again = VHost("/", str(tmp_path), syncer)
    again.properties_codec = AmqpPropertiesCodec()
    try:
        restored = again.queues["q"]
        assert restored.message_count == 1
        assert restored.own_expiry_min_ms == EXPIRY_UNKNOWN  # not read at start-up
        consumer = RecordingConsumer(0)
        again.add_consumer(restored, consumer)
        again.drain()
        assert consumer.bodies == [b"kept"]
        assert restored.own_expiry_min_ms == EXPIRY_NONE
    finally:
        again.close()
