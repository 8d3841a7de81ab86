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


def test_release_counts_refs_down() -> None:
    stored = message()
    assert [stored.release(), stored.release(), stored.release()] == [2, 1, 0]
    assert stored.refs == 0


def test_integers_can_be_changed_in_place_and_the_rest_is_read_only() -> None:
    stored = message()
    stored.refs -= 1
    stored.offset = -1  # a dead letter's stand-in has no offset
    assert (stored.refs, stored.offset) == (2, -1)
    for field in ("exchange", "routing_key", "properties_raw", "body"):
        with pytest.raises(AttributeError):
            setattr(stored, field, b"")
        with pytest.raises(AttributeError):
            delattr(stored, field)


@pytest.mark.parametrize(
    ("position", "value", "message"),
    [
        (1, b"ex", "exchange must be str, not bytes"),
        (2, None, "routing_key must be str, not NoneType"),
        (3, bytearray(b"\x80\x00"), "properties_raw must be bytes, not bytearray"),
        (4, "text", "body must be bytes, not str"),
        (4, memoryview(b"body"), "body must be bytes, not memoryview"),
        (0, 1.0, "offset must be int, not float"),
        (5, "3", "refs must be int, not str"),
    ],
)
def test_construction_refuses_a_field_of_the_wrong_type(
    position: int, value: object, message: str
) -> None:
    arguments: list[object] = [1, "ex", "key", b"", b"body", 1]
    arguments[position] = value
    with pytest.raises(TypeError, match=message):
        StoredMessage(*arguments)  # type: ignore[arg-type]  # wrong on purpose


@pytest.mark.parametrize(
    ("field", "value"), [("offset", 1.5), ("refs", "2"), ("timestamp_ms", None)]
)
def test_an_integer_field_takes_only_integers(field: str, value: object) -> None:
    stored = message()
    with pytest.raises(TypeError):
        setattr(stored, field, value)
    with pytest.raises(TypeError):
        delattr(stored, field)
    assert getattr(stored, field) == getattr(message(), field)


def test_subclasses_of_str_and_bytes_are_refused() -> None:
    # They can carry attributes, so references: an untracked type must not hold them.
    class Tagged(bytes):
        pass

    with pytest.raises(TypeError, match="body must be bytes, not Tagged"):
        StoredMessage(1, "", "q", b"", Tagged(b"x"), 1)


def test_construction_checks_its_arguments() -> None:
    with pytest.raises(TypeError):
        StoredMessage(1, "ex", "q", b"", b"x")  # type: ignore[call-arg]  # refs missing
    with pytest.raises(OverflowError):
        StoredMessage(2**64, "ex", "q", b"", b"x", 1)


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
