"""The gateway's `PropertiesCodec` for TTL and dead-lettering: AMQP properties in and out.

Owns the wire side of what `streamq.broker.deadletter` decides: reading a message's
`expiration` and `CC` keys, and writing the `x-death` header exactly as RabbitMQ 3.10
writes it: a list of tables, newest first, one per queue and reason. A new entry holds
`count`, `reason`, `queue`, `time`, `exchange`, `routing-keys` (the routing key and the
`CC` keys) and, when the message had one, `original-expiration`; a repeated death moves
its entry to the front with `count` raised and every other field kept (time, exchange
and routing keys of the first death there, as RabbitMQ). `x-first-death-reason`,
`-queue` and `-exchange` are set once. The copy loses `expiration`, and `CC` when the
queue has a dead-letter routing key.

Two paths give the same bytes (the unit tests check it on random properties):
- `splice_death`, the one used: it walks the raw properties with the length prefixes
  (tables, arrays and strings carry their size, so a header is skipped without being
  decoded), then joins the unchanged runs of bytes with the new `x-death` value. Only the
  `x-death` entries are looked into, and only their `queue`, `reason` and `count`.
- `with_death_decoded`, the reference: decode everything, edit, encode everything.
  `splice_death` falls back to it for what it does not handle (an `x-death` that is not
  an array of tables, a `count` that is not an int64, an unknown field type, malformed
  bytes: it then raises as the decoder does).
The splice keeps unrelated headers byte for byte, where a decode would collapse
duplicate keys and write RabbitMQ's `L` tag as `l`; for properties our encoder wrote,
the two paths agree to the byte.
"""

from __future__ import annotations

import dataclasses
import functools
import struct
from typing import Final

from amqp_gateway import codec, routing
from amqp_gateway.errors import AMQPError
from streamq.broker.deadletter import Death

_FLAGS = struct.Struct(">H")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_U64 = struct.Struct(">Q")

# Property flag bits (spec 4.2.6.1), in wire order up to expiration.
_CONTENT_TYPE: Final = 0x8000
_CONTENT_ENCODING: Final = 0x4000
_HEADERS: Final = 0x2000
_DELIVERY_MODE: Final = 0x1000
_PRIORITY: Final = 0x0800
_CORRELATION_ID: Final = 0x0400
_REPLY_TO: Final = 0x0200
_EXPIRATION: Final = 0x0100
_NO_EXTRA_FLAGS: Final = 0xFFFC  # the decoder ignores the two low bits; the encoder clears them

# Field value sizes after the tag (values.py); S, x, A and F carry a uint32 size.
_FIXED_SIZES: Final = {
    ord(t): n
    for t, n in zip("tbBsuIilLfdTDV", (1, 1, 1, 2, 2, 4, 4, 8, 8, 4, 8, 8, 5, 0), strict=True)
}
_SIZED: Final = frozenset(b"SxAF")
_TABLE: Final = ord("F")
_ARRAY: Final = ord("A")
_LONGSTR: Final = ord("S")
_INT64: Final = ord("l")

DEATH_TEMPLATES_MAX: Final = 1024  # encoded entries kept per distinct queue, reason, keys

CC_KEY: Final = b"\x02CC"  # a shortstr field name, as it appears inside a table
_X_DEATH: Final = b"x-death"
_FIRST_DEATH_KEYS: Final = (
    (b"x-first-death-reason", "reason"),
    (b"x-first-death-queue", "queue"),
    (b"x-first-death-exchange", "exchange"),
)


class _Unusual(Exception):
    """Something the splice leaves to the decoding path."""


class AmqpPropertiesCodec:
    def expiration_ms(self, properties_raw: bytes) -> int | None:
        try:
            expiration = codec.decode_properties(properties_raw).expiration
        except AMQPError:
            return None
        if expiration is None or routing.expiration_problem(expiration) is not None:
            return None  # refused at publish (routing.check_properties): never expires
        return int(expiration)  # "+5" and "007" are 5 and 7 ms, as in RabbitMQ

    def cc_keys(self, properties_raw: bytes) -> tuple[str, ...]:
        # Most messages have no CC: a byte search spares them the decoding.
        if CC_KEY not in properties_raw:
            return ()
        try:
            headers = codec.decode_properties(properties_raw).headers or {}
        except AMQPError:
            return ()
        value = headers.get("CC")
        return tuple(k for k in value if isinstance(k, str)) if isinstance(value, list) else ()

    def deaths(self, properties_raw: bytes) -> list[tuple[str, str]]:
        try:
            return death_keys(properties_raw)
        except _Unusual:
            return deaths_decoded(properties_raw)

    def with_death(self, properties_raw: bytes, death: Death) -> bytes:
        return splice_death(properties_raw, death)


# -- the splice ------------------------------------------------------------------------------


def splice_death(properties_raw: bytes, death: Death) -> bytes:
    """`properties_raw` with `death` recorded (see the module docstring), spliced.

    Raises `AMQPSyntaxError` as `decode_properties` for malformed properties.
    """
    try:
        return _splice(properties_raw, death)
    except (_Unusual, struct.error, IndexError):
        return with_death_decoded(properties_raw, death)


def _splice(raw: bytes, death: Death) -> bytes:
    (flags,) = _FLAGS.unpack_from(raw, 0)
    position = 2
    if flags & _CONTENT_TYPE:
        position += 1 + raw[position]
    if flags & _CONTENT_ENCODING:
        position += 1 + raw[position]
    table_start = table_end = position
    if flags & _HEADERS:
        table_end = table_start + 4 + _U32.unpack_from(raw, table_start)[0]
    position = table_end
    if flags & _DELIVERY_MODE:
        position += 1
    if flags & _PRIORITY:
        position += 1
    if flags & _CORRELATION_ID:
        position += 1 + raw[position]
    if flags & _REPLY_TO:
        position += 1 + raw[position]
    expiration = None
    tail = position
    if flags & _EXPIRATION:
        tail = position + 1 + raw[position]
        expiration = raw[position + 1 : tail]
    if _properties_end(raw, flags, tail) != len(raw):
        raise _Unusual  # cut or with bytes left over: the decoder reports it
    if flags & _HEADERS:
        body = _headers_with_death(raw, table_start + 4, table_end, death, expiration)
    else:
        body = _first_death_headers(death, expiration)
    return b"".join(
        (
            _FLAGS.pack((flags & _NO_EXTRA_FLAGS & ~_EXPIRATION) | _HEADERS),
            raw[2:table_start],
            _U32.pack(len(body)),
            body,
            raw[table_end:position],
            raw[tail:],
        )
    )


# The properties after expiration: (flag, size or None for a shortstr).
_AFTER_EXPIRATION: Final = (
    (0x80, None),
    (0x40, 8),
    (0x20, None),
    (0x10, None),
    (0x08, None),
    (0x04, None),
)


def _properties_end(raw: bytes, flags: int, position: int) -> int:
    for flag, size in _AFTER_EXPIRATION:
        if flags & flag:
            position += size if size is not None else 1 + raw[position]
    return position


def _value_end(raw: bytes, position: int) -> int:
    """Where the tagged field value at `position` ends."""
    tag = raw[position]
    size = _FIXED_SIZES.get(tag)
    if size is not None:
        return position + 1 + size
    if tag in _SIZED:
        length: int = _U32.unpack_from(raw, position + 1)[0]
        return position + 5 + length
    raise _Unusual  # an unknown type: the decoder reports it


def _headers_with_death(
    raw: bytes, start: int, end: int, death: Death, expiration: bytes | None
) -> bytes:
    """The body of the headers table with x-death replaced (or added) and the
    x-first-death-* headers added when missing; the other entries are copied in runs."""
    parts: list[bytes] = []
    run = start
    x_death: bytes | None = None
    missing = list(_FIRST_DEATH_KEYS)
    position = start
    while position < end:
        key_end = position + 1 + raw[position]
        value_end = _value_end(raw, key_end)
        if value_end > end:
            raise _Unusual
        key = raw[position + 1 : key_end]
        if key == _X_DEATH or (key == b"CC" and death.remove_cc):
            parts.append(raw[run:position])
            run = value_end
            if key == _X_DEATH:
                if x_death is not None:
                    raise _Unusual  # a duplicate key: the decoder keeps the last value
                x_death = _x_death_with(raw, key_end, value_end, death, expiration)
                parts.append(x_death)
        elif key.startswith(b"x-first-death-"):
            missing = [m for m in missing if m[0] != key]
        position = value_end
    if position != end:
        raise _Unusual
    parts.append(raw[run:end])
    if x_death is None:
        parts.append(_X_DEATH_KEY + _array((_new_entry(death, expiration),)))
    if len(missing) == len(_FIRST_DEATH_KEYS):  # a first death: the cached fields
        parts.append(_first_death_fields(death.reason, death.queue, death.exchange))
    else:
        parts.extend(_first_death_entry(key, getattr(death, field)) for key, field in missing)
    return b"".join(parts)


def _first_death_headers(death: Death, expiration: bytes | None) -> bytes:
    return b"".join(
        (
            _X_DEATH_KEY,
            _array((_new_entry(death, expiration),)),
            _first_death_fields(death.reason, death.queue, death.exchange),
        )
    )


_X_DEATH_KEY: Final = b"\x07x-death"


def _first_death_entry(key: bytes, value: str) -> bytes:
    return bytes((len(key),)) + key + _longstr(value.encode("utf-8", "surrogateescape"))


def _x_death_with(
    raw: bytes, start: int, end: int, death: Death, expiration: bytes | None
) -> bytes:
    """`x-death` as a field (key and value) with this death in front: the entry of the
    same queue and reason, its count raised, or a new one."""
    if raw[start] != _ARRAY:
        raise _Unusual
    queue = death.queue.encode("utf-8", "surrogateescape")
    reason = death.reason.encode("utf-8", "surrogateescape")
    front: bytes | None = None
    parts: list[bytes] = []
    run = position = start + 5
    while position < end:
        if raw[position] != _TABLE:
            raise _Unusual  # the decoder drops entries that are not tables
        entry_end = position + 5 + _U32.unpack_from(raw, position + 1)[0]
        if front is None:
            fields = _entry_fields(raw, position + 5, entry_end)
            if fields[0] == queue and fields[1] == reason:
                front = _count_raised(raw, position, entry_end, fields[2])
                parts.append(raw[run:position])
                run = entry_end
        position = entry_end
    if position != end:
        raise _Unusual
    parts.append(raw[run:end])
    if front is None:
        front = _new_entry(death, expiration)
    return _X_DEATH_KEY + _array((front, *parts))


def _entry_fields(raw: bytes, start: int, end: int) -> tuple[bytes | None, bytes | None, int]:
    """(queue, reason, position of the count value) of an x-death entry; the last of
    duplicate keys counts, as in a decoded table; a non-string is None."""
    queue = reason = None
    count = -1
    position = start
    while position < end:
        key_end = position + 1 + raw[position]
        value_end = _value_end(raw, key_end)
        key = raw[position + 1 : key_end]
        if key in (b"queue", b"reason"):
            value = raw[key_end + 5 : value_end] if raw[key_end] == _LONGSTR else None
            if key == b"queue":
                queue = value
            else:
                reason = value
        elif key == b"count":
            count = key_end
        position = value_end
    if position != end:
        raise _Unusual
    return queue, reason, count


def _count_raised(raw: bytes, start: int, end: int, count_at: int) -> bytes:
    if count_at < 0 or raw[count_at] != _INT64:
        raise _Unusual  # no count, or not an int64: the decoder rewrites the entry
    entry = bytearray(raw[start:end])
    at = count_at - start + 1
    _I64.pack_into(entry, at, _I64.unpack_from(entry, at)[0] + 1)
    return bytes(entry)


def _new_entry(death: Death, expiration: bytes | None) -> bytes:
    """A new x-death entry as a tagged table value, fields in RabbitMQ's order."""
    head, tail = _entry_template(death.queue, death.reason, death.exchange, death.routing_keys)
    extra = b"" if expiration is None else b"\x13original-expiration" + _longstr(expiration)
    size = len(head) + 8 + len(tail) + len(extra)
    return b"".join((b"F", _U32.pack(size), head, _U64.pack(death.time_s), tail, extra))


# Dead letters come in runs from few queues: their entries are encoded once, but for
# the time (profile in docs/benchmarks.md, queue features).
@functools.lru_cache(maxsize=DEATH_TEMPLATES_MAX)
def _entry_template(
    queue: str, reason: str, exchange: str, routing_keys: tuple[str, ...]
) -> tuple[bytes, bytes]:
    """A new entry's fields before the time value and after it."""
    keys = b"".join(_longstr(k.encode("utf-8", "surrogateescape")) for k in routing_keys)
    head = b"".join(
        (
            b"\x05countl",
            _I64.pack(1),
            b"\x06reason",
            _longstr(reason.encode("utf-8", "surrogateescape")),
            b"\x05queue",
            _longstr(queue.encode("utf-8", "surrogateescape")),
            b"\x04timeT",
        )
    )
    tail = b"".join(
        (
            b"\x08exchange",
            _longstr(exchange.encode("utf-8", "surrogateescape")),
            b"\x0crouting-keysA",
            _U32.pack(len(keys)),
            keys,
        )
    )
    return head, tail


@functools.lru_cache(maxsize=DEATH_TEMPLATES_MAX)
def _first_death_fields(reason: str, queue: str, exchange: str) -> bytes:
    """The three x-first-death-* fields of a message's first death."""
    return b"".join(
        _first_death_entry(key, value)
        for (key, _), value in zip(_FIRST_DEATH_KEYS, (reason, queue, exchange), strict=True)
    )


def _longstr(value: bytes) -> bytes:
    return b"S" + _U32.pack(len(value)) + value


def _array(values: tuple[bytes, ...]) -> bytes:
    body = b"".join(values)
    return b"A" + _U32.pack(len(body)) + body


def death_keys(properties_raw: bytes) -> list[tuple[str, str]]:
    """The (queue, reason) pairs of `x-death`, newest first, read without decoding the
    rest. Raises `_Unusual` for what `deaths_decoded` must read."""
    try:
        raw = properties_raw
        (flags,) = _FLAGS.unpack_from(raw, 0)
        if not flags & _HEADERS:
            return []
        position = 2
        if flags & _CONTENT_TYPE:
            position += 1 + raw[position]
        if flags & _CONTENT_ENCODING:
            position += 1 + raw[position]
        end = position + 4 + _U32.unpack_from(raw, position)[0]
        position += 4
        found: list[tuple[str, str]] = []
        while position < end:
            key_end = position + 1 + raw[position]
            value_end = _value_end(raw, key_end)
            if raw[position + 1 : key_end] == _X_DEATH:
                found = _death_pairs(raw, key_end, value_end)  # the last of duplicates
            position = value_end
        if position != end:
            raise _Unusual
        return found
    except (struct.error, IndexError) as exc:
        raise _Unusual from exc


def _death_pairs(raw: bytes, start: int, end: int) -> list[tuple[str, str]]:
    if raw[start] != _ARRAY:
        return []
    pairs = []
    position = start + 5
    while position < end:
        if raw[position] != _TABLE:
            raise _Unusual
        entry_end = position + 5 + _U32.unpack_from(raw, position + 1)[0]
        queue, reason, _ = _entry_fields(raw, position + 5, entry_end)
        if queue is None or reason is None:
            raise _Unusual  # missing or not a string: the decoder's str() decides
        pairs.append(
            (queue.decode("utf-8", "surrogateescape"), reason.decode("utf-8", "surrogateescape"))
        )
        position = entry_end
    return pairs


# -- the reference: decode, edit, encode -----------------------------------------------------


def deaths_decoded(properties_raw: bytes) -> list[tuple[str, str]]:
    headers = codec.decode_properties(properties_raw).headers or {}
    entries = headers.get("x-death")
    if not isinstance(entries, list):
        return []
    return [
        (str(entry.get("queue", "")), str(entry.get("reason", "")))
        for entry in entries
        if isinstance(entry, dict)
    ]


def with_death_decoded(properties_raw: bytes, death: Death) -> bytes:
    """What `splice_death` does, by decoding and encoding all the properties.

    Raises `AMQPSyntaxError` for malformed properties.
    """
    properties = codec.decode_properties(properties_raw)
    headers: codec.FieldTable = dict(properties.headers or {})
    if death.remove_cc:
        headers.pop("CC", None)
    previous = headers.get("x-death")
    entries = [e for e in (previous if isinstance(previous, list) else []) if isinstance(e, dict)]
    front: codec.FieldTable | None = None
    for index, entry in enumerate(entries):
        if entry.get("queue") == death.queue and entry.get("reason") == death.reason:
            count = entry.get("count", 0)
            front = {**entry, "count": codec.Int64((count if isinstance(count, int) else 0) + 1)}
            del entries[index]
            break
    if front is None:
        front = {
            "count": codec.Int64(1),
            "reason": death.reason,
            "queue": death.queue,
            "time": codec.Timestamp(death.time_s),
            "exchange": death.exchange,
            "routing-keys": list(death.routing_keys),
        }
        if properties.expiration is not None:
            front["original-expiration"] = properties.expiration
    headers["x-death"] = [front, *entries]
    headers.setdefault("x-first-death-reason", death.reason)
    headers.setdefault("x-first-death-queue", death.queue)
    headers.setdefault("x-first-death-exchange", death.exchange)
    changed = dataclasses.replace(properties, headers=headers, expiration=None)
    return codec.encode_properties(changed)
