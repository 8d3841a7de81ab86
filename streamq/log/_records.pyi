"""Types of the C extension `streamq.log._records` (source: `_records.c`).

Encodes runs of segment-log records (the layout of docs/log-format.md, byte-identical to
`format.encode_record_parts`) into the log's write buffer, and computes CRC32C. No I/O.
"""

from typing import Final, TypeVar

from typing_extensions import Buffer

# A message: (properties, body, anything else the caller keeps with it). A type variable,
# so that a list of any such tuple type is accepted (list is invariant).
_Message = TypeVar("_Message", bound=tuple[bytes, bytes, *tuple[object, ...]])

CRC32C_HARDWARE: Final[bool]
"""True when `crc32c` uses the CPU's SSE4.2 crc32 instruction (decided at import)."""

def encode_records(
    buffer: bytearray,
    first_offset: int,
    timestamp_ms: int,
    exchange: bytes,
    routing_key: bytes,
    messages: list[_Message],
    start: int,
    start_limit: int,
    end_limit: int,
    record_bytes_max: int,
    /,
) -> int:
    """Append the records of `messages[start]`, `messages[start + 1]`, ... to `buffer`.

    Item 0 of each message tuple is its properties, item 1 its body; further items are
    ignored. Record `k` of the run has offset `first_offset + k`; all have `timestamp_ms`,
    `exchange` and `routing_key`. The buffer grows once per call.

    Stops before the first message whose record would start at or after `start_limit`
    bytes, or end past `end_limit` bytes (both counted from `len(buffer)` at the call), or
    is larger than `record_bytes_max` bytes, or at the end of `messages`. Returns the index
    of the first message not encoded (`start` when none was). Messages past that one are
    not looked at.

    Raises, appending nothing:
    - TypeError: an argument of the wrong type, or a message (up to the stop) that is not
      a tuple whose first two items are bytes;
    - ValueError: a negative `start` or limit, or `start > len(messages)`;
    - OverflowError: a value that does not fit its record field (an offset beyond u64,
      `timestamp_ms` beyond i64, an exchange or routing key over 255 bytes, a record
      length beyond u32), or a limit beyond `sys.maxsize`;
    - BufferError: `buffer` is exported (a memoryview of it is alive).
    """

def crc32c(data: Buffer, value: int = 0, /) -> int:
    """CRC32C (Castagnoli) of `data`, continuing from the CRC `value`: the same as the
    crc32c package's `crc32c(data, value)`. Raises OverflowError unless 0 <= value < 2**32."""

def _crc32c_portable(data: Buffer, value: int = 0, /) -> int:
    """`crc32c` computed with the table-driven code only (for the tests)."""

def check_records(data: Buffer, position: int, first_offset: int, /) -> tuple[int, int, str | None]:
    """Check the whole records of `data` from `position` on (the first with offset
    `first_offset`): length, flags, CRC32C and offset sequence. Returns `(end,
    next_offset, error)`: where the good records end, the offset after them, and None or
    what is wrong with the record at `end`. A partial record at the end is not checked."""

def scan_records(
    data: Buffer,
    position: int,
    first_offset: int,
    limit_offset: int,
    base_position: int,
    last_index_position: int,
    interval_bytes: int,
    last_timestamp_ms: int,
    /,
) -> tuple[int, int, int, int, list[tuple[int, int, int]], bool]:
    """Recovery's walk over a segment, one chunk per call: check the whole records of
    `data` from `position` on (length, flags, CRC32C, offsets in sequence from
    `first_offset`, timestamps never decreasing from `last_timestamp_ms`), stopping
    before offset `limit_offset`. `base_position` is the segment position of data[0].

    Returns `(end, next_offset, first_timestamp_ms, last_timestamp_ms, entries,
    stopped)`: where the good records end, the offset after them, the first and last
    timestamps met (-1 when none; the last one carried over), the sparse index entries
    `(offset, position, timestamp_ms)` of records starting `interval_bytes` or more
    after the previous entry (at `last_index_position`), and whether the walk stopped
    for good (a torn, corrupt or out-of-order record, or the limit) rather than at the
    end of the data."""

def resync_records(
    data: Buffer,
    position: int,
    file_bytes: int,
    min_offset: int,
    max_offset: int,
    last_timestamp_ms: int,
    /,
) -> tuple[int, int, bool] | None:
    """Where records start again after damage: the first position `found` at or after
    `position` in `data` whose record header is plausible (length, flags, field lengths),
    whose offset lies in `[min_offset, max_offset + (found - position) // 32]`, whose
    timestamp is not below `last_timestamp_ms` and whose record ends within `file_bytes`
    (the file's bytes from data[0] on). Returns `(found, offset, complete)`: complete when
    the record is wholly in `data` and its CRC32C matches, not when it runs past the end of
    `data` (read on from `found` to check it). None when no position before the last 32
    bytes of `data` qualifies."""

def entry_crcs(entries: Buffer, /) -> bytes:
    """The CRC32C of each osiris chunk entry in `entries` (its size or batch header
    included), big-endian u32s in order; ValueError when an entry crosses the end."""
