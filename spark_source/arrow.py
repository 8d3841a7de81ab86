"""Records to Arrow: the source's fixed schema and the decode of one range into batches.

Owns the Arrow form of the schema (which must equal what Spark derives from the Spark
schema in `source.py`, field for field, nullability included: Spark checks it) and the
executor side of a read: `read_partition` turns a `SegmentRange` into record batches,
applying failOnDataLoss when retention deleted the segment after planning. It imports no
pyspark, so the unit tests run it without a JVM.

Columns: offset, timestamp (append time, UTC), stream, exchange, routing_key, body,
properties (a struct of the 13 basic properties other than headers), and headers
(key/value pairs, when includeHeaders) decoded by `properties.py`. A record a stream client
published (AMQP 1.0, `streamq.log.amqp10`) has the columns an AMQP 0-9-1 consumer would see:
it is converted first, column-wise in C (`_amqp10.convert_records`), and a batch holding one
the C leaves to Python takes the per-record path.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Final

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type stubs

from spark_source import chunkdir, logdir
from spark_source.columns import Ints, RecordColumns
from spark_source.planning import DataLoss, SegmentRange
from spark_source.properties import PROPERTY_NAMES, PropertyValue, decode_properties
from streamq.log import _amqp10
from streamq.log import format as fmt
from streamq.log.amqp10 import NATIVE_MARK, as_amqp091, filter_properties

log = logging.getLogger(__name__)

BATCH_RECORDS_MAX: Final = 10_000  # rows per Arrow batch, Spark's maxRecordsPerBatch
# Converted properties are decoded per distinct value when there are at most one per
# this many rows, else split per row in C (`_split_properties`).
DISTINCT_FEW_RATIO: Final = 16
TIMESTAMP_TYPE: Final = pa.timestamp("us", tz="UTC")
_DECODED: Final = frozenset({"properties", "headers"})  # the columns decode_properties gives
DATA_SECTION: Final = b"\x00\x53\x75"  # an AMQP 1.0 described data section
VBIN8: Final = 0xA0  # its binary with a one-byte length, then
VBIN32: Final = 0xB0  # with a four-byte big-endian length

_PROPERTY_TYPES: Final[dict[str, pa.DataType]] = {
    "delivery_mode": pa.int32(),
    "priority": pa.int32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
}
PROPERTIES_TYPE: Final = pa.struct(
    [
        pa.field(name, _PROPERTY_TYPES.get(name, pa.string()), nullable=True)
        for name in PROPERTY_NAMES
        if name != "headers"
    ]
)
HEADERS_TYPE: Final = pa.list_(
    pa.field(
        "element",
        pa.struct([pa.field("key", pa.string(), nullable=True), pa.field("value", pa.binary())]),
    )
)
_BASE_FIELDS: Final = (
    pa.field("offset", pa.int64()),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("stream", pa.string()),
    pa.field("exchange", pa.string()),
    pa.field("routing_key", pa.string()),
    pa.field("body", pa.binary()),
    pa.field("properties", PROPERTIES_TYPE),
)


def arrow_schema(include_headers: bool) -> pa.Schema:
    """The Arrow schema of every batch (all fields nullable, as Spark's defaults)."""
    fields = list(_BASE_FIELDS)
    if include_headers:
        fields.append(pa.field("headers", HEADERS_TYPE))
    return pa.schema(fields)


def read_partition(
    part: SegmentRange,
    include_headers: bool,
    fail_on_data_loss: bool,
    columns: Sequence[str] | None = None,
) -> Iterator[pa.RecordBatch]:
    """The records of `part` as record batches of at most BATCH_RECORDS_MAX rows, with
    `columns` only (in that order) when given, else every column of the fixed schema.

    Raises DataLoss when the segment was deleted since planning and fail_on_data_loss is
    true (else logs a warning and yields nothing for it); SegmentCorrupted for damage
    when fail_on_data_loss is true (else the damaged records are skipped with a warning).
    """
    batches = _read_batches(part, include_headers, fail_on_data_loss, columns)
    if columns is None:
        yield from batches
    else:
        names = list(columns)
        for batch in batches:
            yield batch.select(names)


def _read_batches(
    part: SegmentRange,
    include_headers: bool,
    fail_on_data_loss: bool,
    columns: Sequence[str] | None,
) -> Iterator[pa.RecordBatch]:
    schema = arrow_schema(include_headers)
    # Properties and headers unread are left null, not decoded (the select drops them).
    properties = columns is None or not _DECODED.isdisjoint(columns)
    try:
        if logdir.is_chunk_segment(part.store, part.base):
            yield from _chunk_batches(part, schema, include_headers, fail_on_data_loss, properties)
            return
        for record_columns in logdir.read_range_columns(
            part.store,
            part.base,
            part.start,
            part.end,
            BATCH_RECORDS_MAX,
            skip_damage=not fail_on_data_loss,
        ):
            yield columns_to_batch(
                record_columns, part.stream, schema, include_headers, properties=properties
            )
    except logdir.SegmentGone as exc:
        lost = f"stream {part.stream!r}: offsets {part.start}..{part.end - 1} are gone ({exc})"
        if fail_on_data_loss:
            raise DataLoss(f"{lost}; set failOnDataLoss=false to skip") from exc
        log.warning("%s; skipping them", lost)


def _chunk_batches(
    part: SegmentRange,
    schema: pa.Schema,
    include_headers: bool,
    fail_on_data_loss: bool,
    properties: bool,
) -> Iterator[pa.RecordBatch]:
    """`read_partition` of a version-2 segment: its chunks' records as columns
    (`chunkdir.read_range_columns`: converted in C, no Python object per record), each a
    batch through `columns_to_batch`; a chunk that only the Python path reads comes as
    records, through `to_batch`."""
    spans = chunkdir.Spans(_frame_payloads, filter_values_ok=not properties)
    try:
        for part_of in chunkdir.read_range_columns(
            part.store, part.base, part.start, part.end, BATCH_RECORDS_MAX,
            skip_damage=not fail_on_data_loss, spans=spans,
        ):  # fmt: skip
            if isinstance(part_of, chunkdir.MessageSpans):
                yield from _spans_batches(part_of, part.stream, schema, include_headers,
                                          properties)  # fmt: skip
            elif isinstance(part_of, list):
                yield to_batch(part_of, part.stream, schema, include_headers)
            else:
                yield columns_to_batch(
                    part_of, part.stream, schema, include_headers, properties=properties
                )
    except FileNotFoundError as exc:
        raise logdir.SegmentGone(f"{part.store.describe()}/segment {part.base}") from exc


def columns_to_batch(
    columns: RecordColumns,
    stream: str,
    schema: pa.Schema,
    include_headers: bool,
    *,
    properties: bool = True,
) -> pa.RecordBatch:
    """One batch of decoded columns, equal to `to_batch` of the same records (with the
    properties and headers columns null when `properties` is false: a read that does
    not select them skips their decode).

    The fixed fields are numpy arrays handed to Arrow as they are. The chunk itself,
    without a copy, becomes one Arrow binary array of five spans per record (header,
    exchange, routing key, properties, body), and each variable column is an Arrow
    `take` of its spans (one memcpy per value, in C). Properties are decoded once per
    distinct value (Arrow's hash dictionary encode), then spread to the rows with `take`.
    """
    c = columns
    count = c.record_count
    native = _has_native(c)
    if native:
        payloads = _data_only_payloads(c)
        if payloads is not None:
            return _data_only_batch(c, payloads, stream, schema, include_headers, properties)
        converted = _converted(c, stream)
        if converted is None:
            return to_batch(_records(c), stream, schema, include_headers)
        exchange, routing_key, raw_properties, body = converted
    else:
        spans = _spans(c)
        exchange, routing_key, raw_properties, body = (
            spans.take(pa.array(np.arange(k, 5 * count, 5, dtype=np.int32))) for k in range(1, 5)
        )
    fixed = _fixed_columns(c.offsets, c.timestamps_ms, stream)
    fields = [*fixed, _utf8(exchange), _utf8(routing_key), body]
    if not properties:
        return pa.RecordBatch.from_arrays([*fields, *_no_properties(count, schema)], schema=schema)
    encoded = raw_properties.dictionary_encode()
    # Few distinct property lists (one publisher's, say): the dictionary path below
    # decodes each once; many (a message id per message): split them in C. Only
    # converted properties are split (the C reads 0-9-1 property lists of one form).
    few = len(encoded.dictionary) * DISTINCT_FEW_RATIO <= count
    if not few and native:
        split = _split_properties(raw_properties, count, include_headers)
        if split is not None:
            return pa.RecordBatch.from_arrays([*fields, *split], schema=schema)
    decoded = [decode_properties(raw) for raw in encoded.dictionary.to_pylist()]
    take = encoded.indices
    arrays = [*fields, _properties_column(_properties_array(decoded), take)]
    if include_headers:
        arrays.append(pa.array([d.get("headers") for d in decoded], HEADERS_TYPE).take(take))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _no_properties(count: int, schema: pa.Schema) -> list[pa.Array]:
    """Null properties (and headers, when the schema has them) for `count` rows."""
    return [pa.nulls(count, field.type) for field in schema if field.name in _DECODED]


def _converted(c: RecordColumns, stream: str) -> tuple[pa.Array, ...] | None:
    """Exchange, routing key, properties and body of each record as AMQP 0-9-1 readers
    see them, native records converted in C (`_amqp10.convert_records`, equal to
    `as_amqp091`) without a Python object per record; None when a record is one only the
    Python converts (then the batch takes `to_batch`)."""
    key = stream.encode("utf-8", "surrogateescape")
    positions, ends, exchange_lens, routing_key_lens, properties_lens = (
        np.ascontiguousarray(a, np.int64).data  # memoryviews: what the stub takes
        for a in (c.positions, c.ends, c.exchange_lens, c.routing_key_lens, c.properties_lens)
    )
    columns = _amqp10.convert_records(
        c.buffer, positions, ends, exchange_lens, routing_key_lens, properties_lens, key
    )
    if columns is None:
        return None
    return tuple(
        pa.Array.from_buffers(
            pa.binary(), c.record_count, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
        )
        for data, offsets in columns
    )


def _fixed_columns(offsets: Ints, timestamps_ms: Ints, stream: str) -> list[pa.Array]:
    """The offset, timestamp and stream columns (int64 offsets and times, as numpy)."""
    count = len(offsets)
    return [
        pa.Array.from_buffers(pa.int64(), count, [None, pa.py_buffer(offsets)]),
        pa.Array.from_buffers(TIMESTAMP_TYPE, count, [None, pa.py_buffer(timestamps_ms * 1000)]),
        _repeated(stream, count),
    ]


def _split_properties(
    properties: pa.Array, count: int, include_headers: bool
) -> list[pa.Array] | None:
    """The properties struct column (and the headers, when asked) straight from the 0-9-1
    property lists split in C (`_amqp10.split_properties`), each header table decoded
    once per distinct value: what the dictionary path gives when (nearly) every record's
    properties differ, as with a message id per message. None when the C declines or a
    string is not UTF-8 (then the dictionary path decodes, and raises as it does)."""
    _validity, offsets, data = properties.buffers()
    split = _amqp10.split_properties(data if data is not None else b"", offsets)
    if split is None:
        return None
    children = {}
    for name, parts in zip(PROPERTY_NAMES, split, strict=True):
        bitmap = pa.py_buffer(np.packbits(np.frombuffer(parts[-1], np.uint8), bitorder="little"))
        kind = HEADERS_TYPE if name == "headers" else PROPERTIES_TYPE.field(name).type
        buffers = [bitmap, *(pa.py_buffer(part) for part in reversed(parts[:-1]))]
        raw_type = pa.binary() if len(buffers) == 3 else kind
        array = pa.Array.from_buffers(raw_type, count, buffers)
        if kind == pa.string():
            try:
                array = array.cast(pa.string())
            except pa.ArrowInvalid:
                return None
        children[name] = array
    tables = children.pop("headers").dictionary_encode()
    decoded = [decode_properties(b"\x20\x00" + raw) for raw in tables.dictionary.to_pylist()]
    struct = pa.StructArray.from_arrays(list(children.values()), fields=list(PROPERTIES_TYPE))
    if not include_headers:
        return [struct]
    headers = pa.array([d.get("headers") for d in decoded], HEADERS_TYPE)
    return [struct, headers.take(tables.indices)]


def _has_native(c: RecordColumns) -> bool:
    """Whether a record's properties start with the native mark: one vectorised compare."""
    if not c.record_count or not len(c.buffer):
        return False
    data = np.frombuffer(c.buffer, np.uint8)
    at = c.positions + fmt.RECORD_HEADER_BYTES + c.exchange_lens + c.routing_key_lens
    last = len(data) - 1
    first_byte = data[np.minimum(at, last)] == NATIVE_MARK[0]
    second_byte = data[np.minimum(at + 1, last)] == NATIVE_MARK[1]
    return bool(np.any((c.properties_lens >= 2) & first_byte & second_byte))


def _data_only_payloads(c: RecordColumns) -> Ints | None:
    """Where each record's payload starts, when every record of the batch is native and
    its body exactly one AMQP 1.0 data section (what stream clients publish without
    properties: `amqp10.to_amqp091`'s first case, vectorised); else None."""
    data = np.frombuffer(c.buffer, np.uint8)
    head = c.positions + fmt.RECORD_HEADER_BYTES + c.exchange_lens + c.routing_key_lens
    body = head + c.properties_lens
    if len(data) < 8 or not bool(np.all(c.properties_lens >= 2)):
        return None
    last = len(data) - 1
    native = (data[head] == NATIVE_MARK[0]) & (data[np.minimum(head + 1, last)] == NATIVE_MARK[1])
    if not bool(np.all(native)):
        return None
    return _section_payloads(data, body, c.ends)


def _frame_payloads(frame: memoryview, starts: Ints, ends: Ints) -> Ints | None:
    """`chunkdir.Spans.payloads`: where each message's payload starts when every message
    of the chunk is exactly one AMQP 1.0 data section (a stream client's without
    properties, as `_data_only_payloads` for records), else None."""
    return _section_payloads(np.frombuffer(frame, np.uint8), starts, ends)


def _section_payloads(data: np.ndarray, body: Ints, ends: Ints) -> Ints | None:
    """Where the payload of each AMQP 1.0 message `data[body[i]:ends[i]]` starts, when
    every one is exactly one data section; else None."""
    size = ends - body
    if len(data) < 8 or not bool(np.all(size >= 5)):
        return None
    last = len(data) - 1
    section = np.all(
        [data[np.minimum(body + k, last)] == DATA_SECTION[k] for k in range(3)], axis=0
    )
    code = data[np.minimum(body + 3, last)]
    small = (code == VBIN8) & (data[np.minimum(body + 4, last)] == size - 5)
    large_at = np.minimum(body + 4, last - 3)
    large_size = (
        (data[large_at].astype(np.int64) << 24)
        | (data[large_at + 1].astype(np.int64) << 16)
        | (data[large_at + 2].astype(np.int64) << 8)
        | data[large_at + 3]
    )
    large = (code == VBIN32) & (size >= 8) & (large_size == size - 8)
    if not bool(np.all(section & (small | large))):
        return None
    return np.where(small, body + 5, body + 8)


def _spans_batches(
    spans: chunkdir.MessageSpans,
    stream: str,
    schema: pa.Schema,
    include_headers: bool,
    properties: bool,
) -> Iterator[pa.RecordBatch]:
    """The batches of a chunk whose messages are data sections alone, as
    `_data_only_batch` makes them from records, straight from the frame: the payloads
    copied once into the body column (before the next frame is read over them) and,
    the chunk having no filter value, one properties value for every row."""
    count = len(spans.payloads)
    for lo in range(0, count, BATCH_RECORDS_MAX):
        hi = min(lo + BATCH_RECORDS_MAX, count)
        offsets = np.arange(spans.first_offset + lo, spans.first_offset + hi, dtype=np.int64)
        stamps = np.full(hi - lo, spans.timestamp_ms, np.int64)
        body = _take_spans(spans.data, spans.payloads[lo:hi], spans.ends[lo:hi])
        no_value = None
        if properties:
            no_value = pa.DictionaryArray.from_arrays(
                pa.array(np.zeros(hi - lo, np.int32)), pa.array([b""], pa.binary())
            )
        fixed = _fixed_columns(offsets, stamps, stream)
        yield _data_only_columns(fixed, body, stream, schema, include_headers, no_value)


def _data_only_batch(
    c: RecordColumns,
    payloads: Ints,
    stream: str,
    schema: pa.Schema,
    include_headers: bool,
    properties: bool,
) -> pa.RecordBatch:
    """`to_batch` of records that `_data_only_payloads` accepted, without a Python object
    per record: the payload spans as bodies, each record's filter value from its routing
    key field."""
    filters = None
    if properties:
        routing_key = c.positions + fmt.RECORD_HEADER_BYTES + c.exchange_lens
        values = _binary_spans(c, routing_key, routing_key + c.routing_key_lens)
        filters = values.dictionary_encode()
    fixed = _fixed_columns(c.offsets, c.timestamps_ms, stream)
    body = _binary_spans(c, payloads, c.ends)
    return _data_only_columns(fixed, body, stream, schema, include_headers, filters)


def _data_only_columns(
    fixed: list[pa.Array],
    body: pa.Array,
    stream: str,
    schema: pa.Schema,
    include_headers: bool,
    filters: pa.DictionaryArray | None,
) -> pa.RecordBatch:
    """The batch of data-section messages: the `fixed` columns, exchange "", the stream as
    routing key, `body`, and properties that hold only the filter value (`filters`, per
    row, dictionary-encoded: each distinct value decoded once; None: the read builds no
    properties, they are null)."""
    count = len(body)
    fields = [*fixed, _repeated("", count), _repeated(stream, count), body]
    if filters is None:
        return pa.RecordBatch.from_arrays([*fields, *_no_properties(count, schema)], schema=schema)
    values = filters.dictionary.to_pylist()
    decoded = [decode_properties(filter_properties(value)) for value in values]
    arrays = [*fields, _properties_column(_properties_array(decoded), filters.indices)]
    if include_headers:
        headers = pa.array([d.get("headers") for d in decoded], HEADERS_TYPE)
        arrays.append(headers.take(filters.indices))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _binary_spans(c: RecordColumns, starts: Ints, ends: Ints) -> pa.Array:
    """`c.buffer[starts[i]:ends[i]]` for each record, as one binary array."""
    return _take_spans(c.buffer, starts, ends)


def _take_spans(buffer: bytes | memoryview, starts: Ints, ends: Ints) -> pa.Array:
    """`buffer[starts[i]:ends[i]]` for each i, as one binary array of its own (a `take`
    of every other span over the buffer, without a Python object per value)."""
    count = len(starts)
    bounds = np.empty(2 * count, np.int64)
    bounds[0::2], bounds[1::2] = starts, ends
    if len(buffer) >= 1 << 31:
        raise ValueError(f"a {len(buffer)}-byte chunk is past Arrow's 2 GiB per array")
    offsets = np.concatenate(([0], bounds)).astype(np.int32)
    spans = pa.Array.from_buffers(
        pa.binary(), 2 * count, [None, pa.py_buffer(offsets), pa.py_buffer(buffer)]
    )
    return spans.take(pa.array(np.arange(1, 2 * count, 2, dtype=np.int32)))


def _records(c: RecordColumns) -> list[fmt.Record]:
    """The columns' records as `fmt.Record`s (for the per-record path)."""
    records = []
    buffer = c.buffer
    for i in range(c.record_count):
        at = int(c.positions[i]) + fmt.RECORD_HEADER_BYTES
        lens = (int(c.exchange_lens[i]), int(c.routing_key_lens[i]), int(c.properties_lens[i]))
        exchange = buffer[at : at + lens[0]]
        at += lens[0]
        routing_key = buffer[at : at + lens[1]]
        at += lens[1]
        properties = buffer[at : at + lens[2]]
        body = buffer[at + lens[2] : int(c.ends[i])]
        offset, timestamp_ms = int(c.offsets[i]), int(c.timestamps_ms[i])
        records.append(fmt.Record(offset, timestamp_ms, exchange, routing_key, properties, body))
    return records


def _properties_column(distinct: pa.StructArray, take: pa.Array) -> pa.StructArray:
    """`distinct.take(take)`, skipping the children that are null in every distinct
    value (most of the 13 properties are absent): a struct take copies every child, and
    measured 60 ns/row here against 15 for this."""
    children = [
        pa.nulls(len(take), child.type) if child.null_count == len(child) else child.take(take)
        for child in distinct.flatten()
    ]
    return pa.StructArray.from_arrays(children, fields=list(PROPERTIES_TYPE))


def _spans(c: RecordColumns) -> pa.Array:
    """The records as a binary array over `c.buffer`: header, exchange, routing key,
    properties and body of each record, back to back as they are in the segment."""
    exchange = c.positions + fmt.RECORD_HEADER_BYTES
    routing_key = exchange + c.exchange_lens
    properties = routing_key + c.routing_key_lens
    body = properties + c.properties_lens
    bounds = np.empty(5 * c.record_count + 1, np.int64)
    for k, starts in enumerate((c.positions, exchange, routing_key, properties, body)):
        bounds[k:-1:5] = starts
    bounds[-1] = c.ends[-1] if c.record_count else 0
    if len(c.buffer) >= 1 << 31:
        raise ValueError(f"a {len(c.buffer)}-byte record is past Arrow's 2 GiB per value")
    offsets = pa.py_buffer(bounds.astype(np.int32))
    return pa.Array.from_buffers(
        pa.binary(), 5 * c.record_count, [None, offsets, pa.py_buffer(c.buffer)]
    )


def _repeated(text: str, count: int) -> pa.Array:
    raw = text.encode("utf-8", "surrogateescape")
    offsets = np.arange(count + 1, dtype=np.int32) * len(raw)
    return pa.Array.from_buffers(
        pa.string(), count, [None, pa.py_buffer(offsets), pa.py_buffer(raw * count)]
    )


def _utf8(values: pa.Array) -> pa.Array:
    """A binary array as strings, invalid UTF-8 replaced as `_text` does."""
    try:
        return values.cast(pa.string())
    except pa.ArrowInvalid:
        return _text(values.to_pylist())


def to_batch(
    records: Sequence[fmt.Record], stream: str, schema: pa.Schema, include_headers: bool
) -> pa.RecordBatch:
    """One batch of `records`: the per-record reference for `columns_to_batch`, used by
    the tests, and its path for batches holding native records. Properties are decoded
    once per distinct byte string (most messages of a stream share a few), then spread to
    the rows with `take`."""
    records = [as_amqp091(stream, r) for r in records]
    distinct: dict[bytes, int] = {}
    indices = [distinct.setdefault(r.properties, len(distinct)) for r in records]
    decoded = [decode_properties(raw) for raw in distinct]
    take = pa.array(indices, pa.int32())
    columns = [
        pa.array([r.offset for r in records], pa.int64()),
        pa.array([r.timestamp_ms * 1000 for r in records], pa.int64()).cast(
            pa.timestamp("us", tz="UTC")
        ),
        pa.array([stream] * len(records), pa.string()),
        _text([r.exchange for r in records]),
        _text([r.routing_key for r in records]),
        pa.array([r.body for r in records], pa.binary()),
        _properties_array(decoded).take(take),
    ]
    if include_headers:
        columns.append(pa.array([d.get("headers") for d in decoded], HEADERS_TYPE).take(take))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _text(values: list[bytes]) -> pa.Array:
    """UTF-8 strings; a peer's invalid UTF-8 (AMQP shortstrs are bytes) becomes U+FFFD
    rather than failing the read."""
    try:
        return pa.array(values, pa.binary()).cast(pa.string())
    except pa.ArrowInvalid:
        return pa.array([v.decode("utf-8", "replace") for v in values], pa.string())


def _properties_array(decoded: list[dict[str, PropertyValue]]) -> pa.Array:
    rows = []
    for values in decoded:
        row = {name: values.get(name) for name in PROPERTIES_TYPE.names}
        seconds = row["timestamp"]
        if isinstance(seconds, int):
            row["timestamp"] = seconds * 1_000_000
        rows.append(row)
    return pa.array(rows, PROPERTIES_TYPE)
