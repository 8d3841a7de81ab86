"""Types of the C extension `streamq.log._streamwire` (sources: `_streamwire.c`,
`_streamwire_runs.c`, `_streamwire_publish.c`).

The stream protocol's per-message work over the segment log: a Publish frame's messages
into native records, the index entries of a run of encoded records, a chunk's entries from
segment bytes, a stored chunk's entries as records for AMQP consumers, and an AMQP 0-9-1
publish run as chunk entries. No I/O.
"""

from collections.abc import Callable

from typing_extensions import Buffer

def publish_entries(
    version: int,
    payload: Buffer,
    sequence: int,
    dedup: bool,
    entry_bytes_max: int,
    /,
) -> tuple[bytes, bytes, bytes, int, int, bytes, int, list[tuple[int, int, bytes]]]:
    """Parse a Publish frame's messages into osiris chunk entries, each as it was sent
    (a simple message or an uncompressed sub-entry batch, its header included), skipping
    duplicates with `dedup` (ids not above `sequence`, -1: none yet). Returns (entries,
    sizes, records: native u32 arrays, message count, records stored, ids: u64 big-endian
    each, the new sequence or -1, filter value runs [(first entry, entries, value)]).
    Raises ValueError."""

def encode_publish(
    version: int,
    payload: Buffer,
    first_offset: int,
    timestamp_ms: int,
    reference: bytes,
    sequence: int,
    record_bytes_max: int,
    /,
) -> tuple[bytes, int, int, bytes, int]:
    """Parse a Publish frame's messages (`payload`: from its message count on; `version`
    1, or 2 with filter values) and encode the ones to store as native records with
    offsets from `first_offset`, all with `timestamp_ms`. With a non-empty `reference`, a
    message whose publishing id is not above `sequence` (then the highest id seen so far)
    is a duplicate and not stored; `sequence` -1 means none stored yet (every id is new,
    0 included). Returns `(records, count, appended, ids, sequence)`: the records back
    to back, the frame's message count, the records written, the count publishing ids
    (u64 big-endian each, in frame order) and the new sequence (-1 while still none).

    Raises ValueError (encoding nothing) for a malformed payload, a filter value or
    reference over 255 bytes, a compressed sub-entry batch or a message over
    `record_bytes_max`; OverflowError when the records would not fit the log."""

def span_indexed(
    data: Buffer,
    position: int,
    segment_position: int,
    first_relative_offset: int,
    last_index_position: int,
    interval_bytes: int,
    end_limit: int,
    /,
) -> tuple[int, int, bytes, bytes, int]:
    """Walk the encoded records of `data` from `position` (by their length fields,
    unchecked) that end within `end_limit` bytes, for a run going into a segment at
    `segment_position` whose first record has relative offset `first_relative_offset`.
    Returns `(end, count, relative_offsets, positions, last_index_position)`: where the
    records walked end, how many there are, and the sparse index entries due among them
    (a record starting `interval_bytes` or more after the previous entry, at
    `last_index_position`) as native u32 arrays for `array("I").frombytes`, and the
    position of the last entry. Raises OverflowError past u32 positions or offsets."""

def chunk_add(
    out: bytearray,
    data: Buffer,
    position: int,
    expected_offset: int,
    skip_before: int,
    offset_end: int,
    records_max: int,
    bytes_max: int,
    convert: Callable[[bytes, bytes, bytes, bytes], bytes],
    values: tuple[bytes, ...] | None,
    match_unfiltered: bool,
    records: int,
    first_offset: int,
    timestamp_ms: int,
    closed: bool,
    /,
) -> tuple[int, int, int, int, int, bool, bool]:
    """Append to the chunk in `out` (its first 48 bytes: the header's room) the entries of
    the records of `data` from `position` (the first with offset `expected_offset`),
    checking each record's length, CRC32C and offset. Records below `skip_before` and
    those the filter refuses are passed over; a native record's entry is its body, a
    0-9-1 record's `convert(exchange, routing_key, properties, body)`. Stops before
    `offset_end`, at `records_max` entries, before an entry past `bytes_max` bytes of
    entries (the first always goes in), before a taken record after a refused one, or at
    the end of the whole records of `data`.

    Returns `(position, next_offset, records, first_offset, timestamp_ms, closed, full)`:
    where it stopped and the offset there, the state to pass to the next call, and
    whether the chunk is done. Raises ValueError for a damaged record."""

def crc32(data: Buffer, start: int, /) -> int:
    """zlib.crc32(data[start:]): the CRC of a chunk's entries (PCLMULQDQ folding where the
    CPU has it)."""

def chunk_message_spans(
    data: Buffer,
    entries_at: int,
    data_length: int,
    num_entries: int,
    first_offset: int,
    num_records: int,
    /,
) -> bytes | None:
    """Where each message of the chunk whose entries are `data[entries_at:][:data_length]`
    is in `data`: native i64 (start, end) pairs, one per record in offset order (source:
    `_streamwire_runs.c`), the entries checked as `chunk_run_records` checks them. None
    when an entry is a compressed sub-entry batch. Raises ValueError as it does."""

def chunk_run_records(
    data: Buffer,
    entries_at: int,
    data_length: int,
    num_entries: int,
    first_offset: int,
    num_records: int,
    timestamp_ms: int,
    filter_runs: list[tuple[int, int, bytes]],
    /,
) -> tuple[bytes, bytes] | None:
    """The records of a chunk whose entries are `data[entries_at:][:data_length]`
    (`num_entries` entries, `num_records` records from `first_offset`, as its header
    says) as version-1 records back to back, one per message (source:
    `_streamwire_runs.c`): the chunk's `timestamp_ms`, an empty exchange, the entry's
    filter value as the routing key (from `filter_runs`, a later run winning), a native
    record's properties (publishing id 0), the message as the body. Returns (records,
    positions: each record's start, native i64s), or None when an entry is a compressed
    sub-entry batch or a filter value is over 255 bytes. Raises ValueError when the
    entries' framing is not what the header says or a batch is malformed."""

def converted_entries(
    messages: list[tuple[bytes, bytes, str, str, int]],
    routing_key: bytes,
    prefix_of: Callable[[bytes], tuple[bytes | None, bytes]],
    convert: Callable[[bytes, bytes], bytes],
    entry_bytes_max: int,
    /,
) -> tuple[bytes, bytes, list[tuple[int, int, bytes]]] | None:
    """The chunk entries of a 0-9-1 publish run (source: `_streamwire_publish.c`): for
    each message (properties, body, ...), a native record's body with `routing_key` as
    its filter value, else `prefix_of(properties)`'s sections (asked again only when the
    properties differ from the message before) and a data section of the body, or with
    None `convert(properties, body)` whole. Returns (entries, sizes with the size field
    as native u32s, filter value runs merged as `frame.add_filter_run` does), or None
    when an entry would be over `entry_bytes_max` bytes with its size field."""
