"""StoredMessage, the C type of `streamq/broker/_message.c`: its fields, the types it
refuses, subclassing, and that CPython's collector leaves it out."""

from __future__ import annotations

import gc
import sys

import pytest

from streamq.broker.paging import PagedMessage
from streamq.broker.queue import StoredMessage


def message(timestamp_ms: int | None = 1_700_000_000_123) -> StoredMessage:
    if timestamp_ms is None:
        return StoredMessage(2**40, "ex", "key", b"\x80\x00", b"body", 3)
    return StoredMessage(2**40, "ex", "key", b"\x80\x00", b"body", 3, timestamp_ms)


def test_fields_read_back_as_given() -> None:
    stored = message()
    assert stored.offset == 2**40
    assert (stored.exchange, stored.routing_key) == ("ex", "key")
    assert (stored.properties_raw, stored.body) == (b"\x80\x00", b"body")
    assert (stored.refs, stored.timestamp_ms) == (3, 1_700_000_000_123)
    assert message(None).timestamp_ms == 0


def test_keywords_and_positional_build_the_same_message() -> None:
    stored = StoredMessage(
        offset=7, exchange="", routing_key="q", properties_raw=b"", body=b"x", refs=1
    )
    assert (stored.offset, stored.routing_key, stored.body, stored.timestamp_ms) == (
        7,
        "q",
        b"x",
        0,
    )


def test_fields_can_be_changed_in_place() -> None:
    stored = message()
    stored.refs -= 1
    stored.body = b"other"
    stored.offset = -1  # a dead letter's stand-in has no offset
    assert (stored.refs, stored.body, stored.offset) == (2, b"other", -1)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("exchange", b"ex"),
        ("routing_key", None),
        ("properties_raw", bytearray(b"\x80\x00")),
        ("body", "text"),
        ("body", memoryview(b"body")),
        ("offset", 1.0),
        ("refs", "3"),
    ],
)
def test_a_field_of_the_wrong_type_is_refused(field: str, value: object) -> None:
    stored = message()
    with pytest.raises(TypeError, match=f"StoredMessage.{field} must be"):
        setattr(stored, field, value)


def test_subclasses_of_str_and_bytes_are_refused() -> None:
    # They can carry attributes, so references: an untracked type must not hold them.
    class Tagged(bytes):
        pass

    with pytest.raises(TypeError, match="body must be bytes, not Tagged"):
        StoredMessage(1, "", "q", b"", Tagged(b"x"), 1)


def test_construction_checks_its_arguments() -> None:
    with pytest.raises(TypeError, match="exchange must be str"):
        StoredMessage(1, b"ex", "q", b"", b"x", 1)
    with pytest.raises(TypeError):
        StoredMessage(1, "ex", "q", b"", b"x")  # type: ignore[call-arg]  # refs missing
    with pytest.raises(OverflowError):
        StoredMessage(2**64, "ex", "q", b"", b"x", 1)
    with pytest.raises(AttributeError, match="cannot delete"):
        del message().body


def test_the_collector_does_not_track_it_or_count_it() -> None:
    stored = message()
    assert not gc.is_tracked(stored)
    # Creating many adds nothing to the young generation's count of tracked objects.
    gc.collect()
    gc.disable()
    try:
        before = gc.get_count()[0]
        kept = [StoredMessage(i, "ex", "key", b"", b"body", 1) for i in range(1000)]
        assert gc.get_count()[0] - before < 10  # the list itself, not its 1,000 messages
    finally:
        gc.enable()
    assert len(kept) == 1000


def test_dropping_a_message_releases_its_fields() -> None:
    body = b"a body of its own " + str(id(object())).encode()
    before = sys.getrefcount(body)
    stored = StoredMessage(1, "ex", "key", b"", body, 1)
    assert sys.getrefcount(body) == before + 1
    del stored
    assert sys.getrefcount(body) == before


def test_a_subclass_with_slots_is_tracked_and_keeps_the_base_fields() -> None:
    class Tracked(StoredMessage):
        __slots__ = ("extra",)

    tracked = Tracked(5, "ex", "key", b"", b"body", 2)  # the base __init__
    tracked.extra = [tracked]  # a cycle, which the collector must be able to free
    assert gc.is_tracked(tracked)
    assert (tracked.offset, tracked.body, tracked.refs) == (5, b"body", 2)
    assert tracked.__class__ is not StoredMessage


def test_paged_message_overrides_the_body_and_copies_the_rest() -> None:
    stored = message()

    class NoLog:
        def read(self, offset: int, count: int) -> list[object]:
            return []

    paged = PagedMessage(stored, 4, NoLog())  # type: ignore[arg-type]  # only read() is used
    assert (paged.offset, paged.exchange, paged.routing_key) == (2**40, "ex", "key")
    assert (paged.refs, paged.timestamp_ms, paged.size) == (3, stored.timestamp_ms, 4)
    with pytest.raises(AttributeError, match="lives in the log"):
        paged.body = b"new"
