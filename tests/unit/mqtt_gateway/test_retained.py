"""Retained messages (mqtt_gateway/retained.py): topic filter matching as MQTT 5.0
section 4.7 has it, the store's limit and its file (round trip, every damage refused)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mqtt_gateway import retained
from mqtt_gateway.retained import RetainedCorrupted, RetainedStore, topic_matches


@pytest.mark.parametrize(
    ("topic_filter", "topic", "matches"),
    [
        ("a/b", "a/b", True),
        ("a/+", "a/b", True),
        ("a/+", "a/b/c", False),
        ("a/#", "a", True),  # the parent level too (MQTT 4.7.1.2)
        ("a/#", "a/b/c", True),
        ("+/+", "/x", True),  # an empty level is a level
        ("#", "$SYS/x", False),  # MQTT-4.7.2-1
        ("+/x", "$SYS/x", False),
        ("$SYS/#", "$SYS/x", True),
        ("a/b", "a/c", False),
        ("a/+/c", "a/b", False),
    ],
)
def test_topic_matches(topic_filter: str, topic: str, matches: bool) -> None:
    assert topic_matches(topic_filter, topic) is matches


def test_the_store_keeps_one_message_per_topic_on_disk(tmp_path: Path) -> None:
    store = RetainedStore(str(tmp_path))
    assert store.retain("a/1", 1, b"one")
    assert store.retain("a/2", 0, b"two")
    assert store.retain("a/1", 0, b"uno")  # replaces
    assert store.retain("a/2", 1, b"")  # clears
    assert store.retain("never", 1, b"")  # clearing nothing is fine
    asyncio.run(store.flush())
    again = RetainedStore(str(tmp_path))
    assert again.messages == {"a/1": (0, b"uno")}
    assert again.matching("a/+") == [("a/1", 0, b"uno")]
    assert again.bytes == len("a/1") + len(b"uno")


def test_the_limit_refuses_a_message_that_would_pass_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(retained, "RETAINED_BYTES_MAX", 10)
    store = RetainedStore(str(tmp_path))
    assert store.retain("t", 0, b"123456789")  # 10 bytes
    assert not store.retain("u", 0, b"1")
    assert store.retain("t", 0, b"12345")  # replacing frees the old one's bytes
    assert store.retain("u", 0, b"1")


def test_every_damaged_byte_is_refused(tmp_path: Path) -> None:
    data = retained.encode({"a": (1, b"xy"), "b/c": (0, b"")})
    assert retained.decode(data, "f") == {"a": (1, b"xy"), "b/c": (0, b"")}
    for index in range(len(data)):
        damaged = bytearray(data)
        damaged[index] ^= 0x40
        with pytest.raises(RetainedCorrupted):
            retained.decode(bytes(damaged), "f")
    for cut in range(len(data)):
        with pytest.raises(RetainedCorrupted):
            retained.decode(data[:cut], "f")
    (tmp_path / retained.FILE_NAME).write_bytes(data[:-1])
    with pytest.raises(RetainedCorrupted):
        RetainedStore(str(tmp_path))


def test_properties_are_kept_in_a_version_2_file(tmp_path: Path) -> None:
    store = RetainedStore(str(tmp_path))
    assert store.retain("plain", 0, b"p")
    assert store.retain("with", 1, b"w", b"\x80\x00\x03abc", 1234)
    assert store.bytes == len("plainpwithw") + 6
    asyncio.run(store.flush())
    data = (tmp_path / retained.FILE_NAME).read_bytes()
    assert data[4:6] == b"\x02\x00"  # version 2
    again = RetainedStore(str(tmp_path))
    assert again.messages == {"plain": (0, b"p"), "with": (1, b"w")}
    assert again.properties == {"with": (b"\x80\x00\x03abc", 1234)}
    assert again.bytes == store.bytes
    assert again.retain("with", 1, b"w2")  # replaced without properties: they go
    assert again.properties == {}
    assert again.bytes == len("plainpwithw2")
    asyncio.run(again.flush())
    assert (tmp_path / retained.FILE_NAME).read_bytes()[4:6] == b"\x01\x00"  # back to 1


def test_a_version_2_file_refuses_every_damage() -> None:
    data = retained.encode({"a": (1, b"xy"), "b": (0, b"z")}, {"a": (b"props", 7)})
    assert retained.decode_all(data, "f") == (
        {"a": (1, b"xy"), "b": (0, b"z")},
        {"a": (b"props", 7)},
    )
    for cut in range(len(data)):
        with pytest.raises(RetainedCorrupted):
            retained.decode(data[:cut], "f")
    for index in range(len(data)):
        damaged = bytearray(data)
        damaged[index] ^= 0x40
        with pytest.raises(RetainedCorrupted):
            retained.decode(bytes(damaged), "f")
