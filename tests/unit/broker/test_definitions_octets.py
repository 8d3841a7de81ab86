"""Names, keys and arguments with octets that are not UTF-8 are durable like any other.

Regression of a fuzz finding (docs/fuzzing.md): AMQP keeps a shortstr's octets as they
are (surrogateescape, as RabbitMQ keeps any binary), but the definitions log encoded its
JSON records as strict UTF-8, so a `queue.bind` whose routing key held the octet 0x80
raised UnicodeEncodeError inside the vhost: the client got 541 INTERNAL_ERROR. Now such a
record is written with JSON escapes, and reads back the same after a restart.
"""

from __future__ import annotations

from pathlib import Path

from streamq.broker.broker import Broker
from streamq.broker.definitions import decode_file, encode_file, encode_record
from streamq.broker.exchange import Destination

KEY = b"a.\x80\xff".decode("utf-8", "surrogateescape")


def test_a_record_with_escaped_octets_round_trips() -> None:
    op: dict[str, object] = {"op": "bind", "routing_key": KEY, "arguments": {KEY: KEY}}
    assert b"\\udc80" in encode_record(op)
    ops, _valid = decode_file("defs", encode_file([op]))
    assert ops == [op]


def test_a_binding_with_a_non_utf8_key_survives_a_restart(tmp_path: Path) -> None:
    data_dir = str(tmp_path / "data")
    broker = Broker(data_dir, direct_io=False)
    try:
        vhost = broker.vhost("/")
        vhost.declare_queue(KEY, False, True, False, False, {}, None)
        vhost.bind(Destination("queue", KEY), "amq.topic", KEY, {"x": KEY})
    finally:
        broker.close()
    reopened = Broker(data_dir, direct_io=False)
    try:
        bindings = reopened.vhost("/").exchanges["amq.topic"].bindings
        assert [(b.routing_key, b.destination.name) for b in bindings] == [(KEY, KEY)]
    finally:
        reopened.close()
