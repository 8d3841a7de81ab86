"""The definitions journal and a vhost's durable state across reopen, without sockets."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from streamq.broker.definitions import (
    DefinitionsCorrupted,
    DefinitionsJournal,
    arguments_from_json,
    arguments_to_json,
    encode_file,
)
from streamq.broker.exchange import Destination
from streamq.broker.vhost import VHost
from streamq.log.syncer import Syncer


def test_argument_values_round_trip_through_json() -> None:
    arguments = {
        "x-max-length": 10,
        "x-ratio": 0.5,
        "x-name": "n",
        "x-flag": True,
        "x-none": None,
        "x-dec": Decimal("1.25"),
        "x-raw": b"\x00\xff",
        "x-list": [1, "a", b"b"],
        "x-table": {"k": 1, "nested": {"j": [2]}},
    }
    assert arguments_from_json(arguments_to_json(arguments)) == arguments


def test_a_torn_last_record_is_cut_off(tmp_path: Path) -> None:
    path = tmp_path / "definitions"
    ops = [{"op": "queue", "name": f"q{n}"} for n in range(3)]
    data = encode_file(ops)
    path.write_bytes(data[:-3])
    journal, loaded = DefinitionsJournal.open(str(path))
    journal.close()
    assert loaded == ops[:2]
    assert path.read_bytes() == encode_file(ops[:2])


def test_a_bad_record_before_the_last_is_corruption(tmp_path: Path) -> None:
    path = tmp_path / "definitions"
    data = bytearray(encode_file([{"op": "queue", "name": f"q{n}"} for n in range(3)]))
    data[16] ^= 0x01  # inside the first record's payload
    path.write_bytes(bytes(data))
    with pytest.raises(DefinitionsCorrupted, match="at byte 8"):
        DefinitionsJournal.open(str(path))


def reopen(vhost: VHost, syncer: Syncer) -> VHost:
    vhost.close()
    return VHost(vhost.name, vhost.directory, syncer)


def test_a_vhost_restores_entities_and_messages(tmp_path: Path) -> None:
    """Replay applies recorded changes without side effects: an auto-delete exchange
    removed with its last binding stays removed; deleted queues take their bindings."""
    syncer = Syncer()
    vhost = VHost("/", str(tmp_path / "vh"), syncer)
    owner = object()
    vhost.declare_exchange("ad", "fanout", False, True, True, False, {})
    vhost.declare_exchange("t", "topic", False, True, False, False, {"alternate-exchange": "ad"})
    vhost.declare_queue("q1", False, True, False, False, {"x-max-length": 5}, owner)
    vhost.declare_queue("q2", False, True, False, False, {}, owner)
    vhost.declare_queue("tmp", False, False, False, False, {}, owner)
    vhost.bind(Destination("queue", "q1"), "t", "a.#", {})
    vhost.bind(Destination("queue", "q2"), "ad", "", {})
    vhost.bind(Destination("queue", "tmp"), "t", "#", {})
    vhost.unbind(Destination("queue", "q2"), "ad", "", {})  # ad auto-deletes
    for n in range(3):
        vhost.publish("t", "a.b", b"", str(n).encode(), vhost.route("t", "a.b", None))
    vhost = reopen(vhost, syncer)
    try:
        assert "ad" not in vhost.exchanges
        assert set(vhost.queues) == {"q1", "q2"}
        assert vhost.queues["q1"].arguments == {"x-max-length": 5}
        assert [q.name for q in vhost.route("t", "a.z", None)] == ["q1"]
        assert vhost.queues["q1"].cursor.message_count == 3
        taken = vhost.get(vhost.queues["q1"], 0)
        assert taken is not None
        assert taken[1].body == b"0"
        vhost.delete_queue("q1", False, False, owner)
        vhost = reopen(vhost, syncer)
        assert set(vhost.queues) == {"q2"}
        assert vhost.route("t", "a.z", None) == []
    finally:
        vhost.close()
        syncer.close()
