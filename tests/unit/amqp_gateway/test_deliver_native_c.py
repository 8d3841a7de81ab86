"""The C run of stream deliveries stops before a record a stream client published (its
properties start with streamq.log.amqp10.NATIVE_MARK), leaving it to the per-record path
that converts it from AMQP 1.0; splicing x-stream-offset into it would corrupt it."""

from __future__ import annotations

from amqp_gateway.codec.properties import BasicProperties, encode_properties
from streamq.log.amqp10 import native_properties
from tests.unit.amqp_gateway.test_deliver_stream_c import c_run, check_against_python, segment


def test_a_native_record_stops_the_run_before_it() -> None:
    plain = encode_properties(BasicProperties(content_type="text/plain"))
    native = native_properties(3)
    messages = [(plain, b"a"), (plain, b"b"), (native, b"\x00\x53\x75\xa0\x01c"), (plain, b"d")]
    assert check_against_python(messages, 5, 4096) == (2, True)
    _, (delivered, _, next_offset, stopped) = c_run(segment(0, [(native, b"x")]), 0, 0, 1, 4096)
    assert (delivered, next_offset, stopped) == (0, 0, True)
