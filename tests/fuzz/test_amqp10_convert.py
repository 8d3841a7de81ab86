"""Fuzz the C conversion of stream clients' AMQP 1.0 messages (streamq/log/_amqp10.c and
its use in amqp_gateway/codec/_deliver.c), which reads what any stream-protocol publisher
stored: every AMQP consumer, HTTP stream read and Spark read of the stream runs it.

An input is a filter value (its length in the first byte, then its bytes) and the
message bytes after it. The property: `_amqp10.convert` raises nothing and gives exactly
the Python reference's result (`amqp10.to_amqp091_reference`) or None; the run splice
delivers the record as the per-record path does (the reference, `with_long_header`,
`encode_deliver`) or stops before it; `convert_records` agrees with `convert`.

Run: pytest tests/fuzz/test_amqp10_convert.py (bounded), or
python -m tests.fuzz.soak amqp10_convert -runs=1000000 (atheris soak, tools/fuzz.sh).
"""

from __future__ import annotations

from typing import Final

import numpy as np

from amqp_gateway import codec
from amqp_gateway.channels import with_long_header
from streamq.log import _amqp10
from streamq.log import format as fmt
from streamq.log.amqp10 import native_properties, to_amqp091_reference
from streamq.log.format import Record
from tests.fuzz.harness import bounded_run

CORPUS: Final = "amqp10"
EXAMPLES: Final = 2000
STREAM: Final = "s"
FRAME_MAX: Final = 4096


def fuzz_one(data: bytes) -> None:
    size = data[0] if data else 0
    filter_value, body = data[1 : 1 + size], data[1 + size :]
    record = Record(9, 1, b"", filter_value, native_properties(9), body)
    expected = to_amqp091_reference(STREAM, record)
    converted = _amqp10.convert(body, STREAM.encode(), filter_value)
    assert converted is None or converted == expected, (converted, expected)
    encoded = fmt.encode_record_parts(*record)
    out = bytearray()
    delivered, *_rest = codec.deliver_stream_records(
        out, encoded, 0, 9, 1, 1, b"t", 1, FRAME_MAX, 0, STREAM.encode()
    )
    if delivered:
        exchange, routing_key, properties, payload = expected
        spliced = with_long_header(properties, "x-stream-offset", 9)
        want = bytearray()
        codec.encode_deliver(
            want, 1, b"t", 1, False, exchange, routing_key, spliced, payload, FRAME_MAX
        )
        assert out == want
    lens = [[0], [len(filter_value)], [len(record.properties)]]
    arrays = [np.array(v, np.int64) for v in ([0], [len(encoded)], *lens)]
    columns = _amqp10.convert_records(encoded, *arrays, STREAM.encode())
    assert (columns is None) == (converted is None)
    if columns is not None and converted is not None:
        assert [pair[0] for pair in columns] == [converted[k] for k in range(4)]


def test_amqp10_convert_bounded() -> None:
    bounded_run(fuzz_one, CORPUS, EXAMPLES)
