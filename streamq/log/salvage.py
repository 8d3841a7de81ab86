"""The intact entries of a stored chunk whose entries fail their CRC32: `salvage`.

Owns the per-entry rule of bit rot in a version-2 segment (docs/durability.md, "Bit
rot"): when a frame's CRC32C holds (its header, filter and trailer are sound) but the
entries' CRC32 does not (`frame.EntriesDamaged`), each entry is checked against its own
CRC32C in the trailer's 0x81 record (`frame`), and only the entries that fail are lost.

When the size fields still frame exactly `num_entries` entries filling the chunk, each
entry stands or falls by its own CRC32C. Otherwise (a damaged size field) the walk goes
entry by entry: after an entry that fails, the next one starts where its size field says
when the entry found there checks, else at the first later position where one of the
next SEARCH_ENTRIES_MAX entries checks against its CRC32C; when none does, every entry
from the damaged one on is lost.
Offsets: intact entries count their records, and the chunk's `num_records` (its header
is sound) the lost ones. One lost run holds the rest. Several are trusted only when each
is one entry that still reads as a simple entry (1 record) and they add up; otherwise
the intact entries before the first lost run and after the last are kept (counted from
the chunk's first offset and back from its end) and everything between is lost: a
reader never gets a record under a wrong offset.

A chunk without the 0x81 record, or whose record does not list every entry, cannot be
salvaged (ChunkInvalid): the caller loses the whole chunk. Pure functions on a buffer;
no I/O, no state.
"""

from __future__ import annotations

from typing import Final, NamedTuple

from streamq.log import chunk, frame
from streamq.log._records import crc32c
from streamq.log.chunk import ChunkHeader, ChunkInvalid, EntryView
from streamq.log.damage import DamagedSpan

_BATCH_HEAD: Final = chunk.BATCH_HEADER.size  # 11
_SIMPLE_HEAD: Final = chunk.SIMPLE_SIZE.size  # 4
SEARCH_ENTRIES_MAX: Final = 4  # entries after a damaged one searched for (each a pass)


class LostEntries(NamedTuple):
    """Entries of a chunk lost to damage: their bytes and offsets."""

    start: int  # position in the buffer of the first lost byte
    end: int  # position after the last
    first_offset: int
    end_offset: int  # [first_offset, end_offset) lost


class Salvage(NamedTuple):
    """What a damaged chunk still holds: its intact entries (with their entry numbers,
    for the trailer's filter values) and what was lost."""

    entries: list[tuple[int, EntryView]]
    lost: list[LostEntries]


class _Gap(NamedTuple):
    first: int  # entry number
    end: int  # entry number after it
    start: int  # position
    stop: int  # position
    records: int | None  # from the lost entries' headers, when they can tell


def salvage(buffer: bytes | bytearray | memoryview, pos: int, header: ChunkHeader) -> Salvage:
    """The intact entries of the chunk at `pos` of `buffer` (its frame CRC32C checked by
    the caller) and its lost ones; ChunkInvalid when the chunk has no usable entry
    checksums (then the whole chunk is lost)."""
    trailer = frame.parse_trailer(chunk.trailer_of(buffer, pos, header))
    crcs = trailer.entry_crcs
    count = header.num_entries
    if len(crcs) != count * frame.ENTRY_CRC_BYTES:
        raise ChunkInvalid(f"chunk at offset {header.first_offset}: no entry checksums")
    view = memoryview(buffer)
    start = pos + chunk.HEADER_BYTES + header.bloom_size
    end = start + header.data_length
    intact, gaps = _walk(view, start, end, crcs, count)
    return _place(view, header, end, intact, gaps)


def damaged_spans(
    path: str, base: int, position: int, lost: list[LostEntries]
) -> list[DamagedSpan]:
    """The damage map's spans of `lost`, found in the frame at `position` of the segment
    `path` at `base` (the buffer `salvage` read was that frame)."""
    return [
        DamagedSpan(path, base, position + span.start, position + span.end, span.first_offset,
                    span.end_offset, span.end - span.start)
        for span in lost
    ]  # fmt: skip


def _walk(
    view: memoryview, at: int, end: int, crcs: bytes, count: int
) -> tuple[list[tuple[int, int, int, int]], list[_Gap]]:
    """(number, position, size, records) of each intact entry, and the lost runs."""
    framing = _framing(view, at, end, count)
    if framing is not None:  # the size fields hold: each entry stands or falls alone
        intact: list[tuple[int, int, int, int]] = []
        gaps: list[_Gap] = []
        for number, (place, size, records) in enumerate(framing):
            if _checks(view, place, size, crcs, number):
                intact.append((number, place, size, records))
            else:
                gaps.append(_Gap(number, number + 1, place, place + size, _simple(view, place)))
        return intact, gaps
    return _walk_searching(view, at, end, crcs, count)


def _framing(view: memoryview, at: int, end: int, count: int) -> list[tuple[int, int, int]] | None:
    """(position, size, records) of each entry by the size fields alone, when they give
    exactly `count` entries that fill the entries to `end`; None otherwise."""
    out: list[tuple[int, int, int]] = []
    while at < end and len(out) < count:
        size, records = _entry_at(view, at, end)
        if not size:
            return None
        out.append((at, size, records))
        at += size
    return out if at == end and len(out) == count else None


def _walk_searching(
    view: memoryview, at: int, end: int, crcs: bytes, count: int
) -> tuple[list[tuple[int, int, int, int]], list[_Gap]]:
    """`_walk` when a size field is damaged: after an entry that fails, the next intact
    one is searched for by its CRC32C (up to SEARCH_ENTRIES_MAX entries on)."""
    intact: list[tuple[int, int, int, int]] = []
    gaps: list[_Gap] = []
    number = 0
    while number < count:
        size, records = _entry_at(view, at, end)
        if size and _checks(view, at, size, crcs, number):
            intact.append((number, at, size, records))
            at += size
            number += 1
            continue
        found = None
        if size and number + 1 < count and _entry_checks(view, at + size, end, crcs, number + 1):
            found = (at + size, number + 1)
        elif number + 1 < count:
            found = _search_any(view, at + 1, end, crcs, number + 1, count)
        if found is None:  # the last entry, or nothing checks after it
            known = _simple(view, at) if size and number + 1 == count else None
            gaps.append(_Gap(number, count, at, end, known))
            break
        following, next_number = found
        known = _simple(view, at) if next_number == number + 1 else None
        gaps.append(_Gap(number, next_number, at, following, known))
        at, number = following, next_number
    return intact, gaps


def _place(
    view: memoryview,
    header: ChunkHeader,
    end: int,
    intact: list[tuple[int, int, int, int]],
    gaps: list[_Gap],
) -> Salvage:
    """Offsets for the intact entries and the lost runs: one lost run holds whatever
    records the intact entries leave; several are trusted only when each is one entry
    that still reads as a simple entry (1 record) and they add up, else everything from
    the first lost run to the end of the last is lost as one run."""
    lost_total = header.num_records - sum(records for _, _, _, records in intact)
    if len(gaps) == 1 and lost_total > 0:
        gaps = [gaps[0]._replace(records=lost_total)]
    elif (
        any(gap.records is None for gap in gaps) or sum(g.records or 0 for g in gaps) != lost_total
    ):
        return _lost_between(view, header, intact, gaps)
    events = [(n, at, size, records, True) for n, at, size, records in intact]
    events += [(g.first, g.start, g.stop - g.start, g.records or 0, False) for g in gaps]
    events.sort()
    entries: list[tuple[int, EntryView]] = []
    lost: list[LostEntries] = []
    offset = header.first_offset
    for number, at, size, records, good in events:
        if good:
            entries.append((number, _view(view, at, size, offset)))
        else:
            lost.append(LostEntries(at, at + size, offset, offset + records))
        offset += records
    return Salvage(entries, lost)


def _lost_between(
    view: memoryview,
    header: ChunkHeader,
    intact: list[tuple[int, int, int, int]],
    gaps: list[_Gap],
) -> Salvage:
    """The intact entries before the first lost run (offsets counted from the chunk's
    first) and after the last (counted back from its end); everything between lost."""
    first, last = gaps[0], gaps[-1]
    entries: list[tuple[int, EntryView]] = []
    offset = header.first_offset
    for number, at, size, records in intact:
        if number < first.first:
            entries.append((number, _view(view, at, size, offset)))
            offset += records
    after: list[tuple[int, EntryView]] = []
    back = header.next_offset
    for number, at, size, records in reversed(intact):
        if number >= last.end:
            back -= records
            after.append((number, _view(view, at, size, back)))
    if back < offset:  # the counts do not add up: nothing after the first lost run
        after, back = [], header.next_offset
    lost = [LostEntries(first.start, last.stop, offset, back)] if back > offset else []
    return Salvage(entries + after[::-1], lost)


def _simple(view: memoryview, at: int) -> int | None:
    """1 when the (damaged) entry at `at` still reads as a simple entry, else None."""
    return None if view[at] & chunk.BATCH_FLAG else 1


def _entry_at(view: memoryview, at: int, end: int) -> tuple[int, int]:
    """(size, records) of the entry at `at` as its header says, (0, 0) when it does not
    fit before `end`."""
    if end - at < _SIMPLE_HEAD:
        return 0, 0
    if view[at] & chunk.BATCH_FLAG:
        if end - at < _BATCH_HEAD:
            return 0, 0
        _kind, records, _uncompressed, length = chunk.BATCH_HEADER.unpack_from(view, at)
        size = _BATCH_HEAD + length
    else:
        (length,) = chunk.SIMPLE_SIZE.unpack_from(view, at)
        size, records = _SIMPLE_HEAD + length, 1
    return (size, records) if size <= end - at else (0, 0)


def _checks(view: memoryview, at: int, size: int, crcs: bytes, number: int) -> bool:
    want = int.from_bytes(crcs[number * 4 : number * 4 + 4], "big")
    return crc32c(view[at : at + size]) == want


def _entry_checks(view: memoryview, at: int, end: int, crcs: bytes, number: int) -> bool:
    size, _records = _entry_at(view, at, end)
    return bool(size) and _checks(view, at, size, crcs, number)


def _search_any(
    view: memoryview, at: int, end: int, crcs: bytes, number: int, count: int
) -> tuple[int, int] | None:
    """(position, number) of the first of entries `number` to `number` +
    SEARCH_ENTRIES_MAX - 1 found intact from `at` on."""
    for candidate in range(number, min(number + SEARCH_ENTRIES_MAX, count)):
        position = _search(view, at, end, crcs, candidate)
        if position is not None:
            return position, candidate
    return None


def _search(view: memoryview, at: int, end: int, crcs: bytes, number: int) -> int | None:
    """The first position from `at` where an entry checks against entry `number`'s CRC32C
    (bounded by the chunk's entries: at most 1 MiB by default)."""
    for candidate in range(at, end):
        if _entry_checks(view, candidate, end, crcs, number):
            return candidate
    return None


def _view(view: memoryview, at: int, size: int, offset: int) -> EntryView:
    """The EntryView of the intact entry of `size` bytes at `at`, its first offset `offset`."""
    if view[at] & chunk.BATCH_FLAG:
        kind, records, uncompressed, _length = chunk.BATCH_HEADER.unpack_from(view, at)
        compression = (kind & chunk.COMPRESSION_MASK) >> chunk.COMPRESSION_SHIFT
        return EntryView(offset, records, True, compression, uncompressed,
                         view[at + _BATCH_HEAD : at + size])  # fmt: skip
    return EntryView(offset, 1, False, chunk.COMPRESSION_NONE, size - _SIMPLE_HEAD,
                     view[at + _SIMPLE_HEAD : at + size])  # fmt: skip
