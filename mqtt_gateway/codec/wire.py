"""MQTT's data representations (5.0 section 1.5): integers, Variable Byte Integers,
UTF-8 strings, binary data and string pairs.

`Reader` walks one packet's variable header and payload and raises only `MalformedPacket`
(truncation, a fifth or overlong varint byte, ill-formed UTF-8 or U+0000); `Writer`
appends to one `bytearray` and raises `ValueError` for what the wire cannot carry.
`read_varint` is also used on the receive buffer, where "not yet complete" is None.
"""

from __future__ import annotations

import struct
from typing import Final

from mqtt_gateway.codec.constants import STRING_BYTES_MAX, VARINT_BYTES_MAX, VARINT_MAX
from mqtt_gateway.codec.errors import MalformedPacket

_U16: Final = struct.Struct(">H")
_U32: Final = struct.Struct(">I")
_CONTINUE: Final = 0x80
_DIGIT: Final = 0x7F


def read_varint(view: memoryview, position: int) -> tuple[int, int] | None:
    """Decode a Variable Byte Integer at `position`: (value, position after), or None when
    `view` ends before its last byte. Raises `MalformedPacket` for a fifth byte
    (MQTT-1.5.5) or a non-minimal encoding (MQTT-1.5.5-1: the last byte of a multi-byte
    encoding is never 0)."""
    value = 0
    for index in range(VARINT_BYTES_MAX):
        if position + index >= len(view):
            return None
        byte = view[position + index]
        value |= (byte & _DIGIT) << (7 * index)
        if not byte & _CONTINUE:
            if byte == 0 and index > 0:
                raise MalformedPacket("variable byte integer not in its shortest form")
            return value, position + index + 1
    raise MalformedPacket(f"variable byte integer longer than {VARINT_BYTES_MAX} bytes")


def varint_bytes(value: int) -> bytes:
    """Encode a Variable Byte Integer; `ValueError` past VARINT_MAX or below 0."""
    if not 0 <= value <= VARINT_MAX:
        raise ValueError(f"variable byte integer {value} out of range")
    out = bytearray()
    while True:
        digit = value & _DIGIT
        value >>= 7
        if value:
            out.append(digit | _CONTINUE)
        else:
            out.append(digit)
            return bytes(out)


def check_utf8(data: bytes, what: str) -> str:
    """Decode an MQTT UTF-8 string (MQTT-1.5.4-1, -2): well-formed (Python's strict codec
    refuses encoded surrogates and overlong forms) and without U+0000."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedPacket(f"{what}: ill-formed UTF-8") from exc
    if "\x00" in text:
        raise MalformedPacket(f"{what}: U+0000 in a UTF-8 string")
    return text


def encode_utf8(text: str, what: str) -> bytes:
    """The UTF-8 bytes of `text`; `ValueError` for U+0000, a lone surrogate or > 65535 bytes."""
    if "\x00" in text:
        raise ValueError(f"{what}: U+0000 cannot be sent in an MQTT string")
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{what}: a lone surrogate cannot be sent in UTF-8") from exc
    if len(data) > STRING_BYTES_MAX:
        raise ValueError(f"{what}: {len(data)} bytes exceed {STRING_BYTES_MAX}")
    return data


class Reader:
    """A cursor over one packet's bytes after the fixed header; every read checks bounds."""

    __slots__ = ("_end", "_view", "position")

    def __init__(self, data: bytes | bytearray | memoryview, position: int = 0) -> None:
        self._view = memoryview(data)
        self._end = len(self._view)
        self.position = position

    @property
    def remaining(self) -> int:
        return self._end - self.position

    def _need(self, size: int, what: str) -> None:
        if self.position + size > self._end:
            raise MalformedPacket(f"truncated packet: {what} needs {size} bytes")

    def u8(self, what: str) -> int:
        self._need(1, what)
        value = self._view[self.position]
        self.position += 1
        return value

    def u16(self, what: str) -> int:
        self._need(2, what)
        (value,) = _U16.unpack_from(self._view, self.position)
        self.position += 2
        assert isinstance(value, int)
        return value

    def u32(self, what: str) -> int:
        self._need(4, what)
        (value,) = _U32.unpack_from(self._view, self.position)
        self.position += 4
        assert isinstance(value, int)
        return value

    def varint(self, what: str) -> int:
        decoded = read_varint(self._view[: self._end], self.position)
        if decoded is None:
            raise MalformedPacket(f"truncated packet: {what}")
        value, self.position = decoded
        return value

    def raw(self, size: int, what: str) -> bytes:
        self._need(size, what)
        data = bytes(self._view[self.position : self.position + size])
        self.position += size
        return data

    def rest(self) -> bytes:
        return self.raw(self.remaining, "payload")

    def binary(self, what: str) -> bytes:
        return self.raw(self.u16(what), what)

    def string(self, what: str) -> str:
        return check_utf8(self.binary(what), what)

    def sub_reader(self, size: int, what: str) -> Reader:
        """A reader over the next `size` bytes (a property list), which this one skips."""
        self._need(size, what)
        reader = Reader(self._view[: self.position + size], self.position)
        self.position += size
        return reader

    def expect_end(self, what: str) -> None:
        if self.remaining:
            raise MalformedPacket(f"{what}: {self.remaining} unexpected trailing bytes")


class Writer:
    """Appends MQTT data representations to a caller's bytearray."""

    __slots__ = ("out",)

    def __init__(self, out: bytearray) -> None:
        self.out = out

    def u8(self, value: int) -> None:
        if not 0 <= value <= 0xFF:
            raise ValueError(f"byte {value} out of range")
        self.out.append(value)

    def u16(self, value: int) -> None:
        try:
            self.out += _U16.pack(value)
        except struct.error as exc:
            raise ValueError(f"two-byte integer {value} out of range") from exc

    def u32(self, value: int) -> None:
        try:
            self.out += _U32.pack(value)
        except struct.error as exc:
            raise ValueError(f"four-byte integer {value} out of range") from exc

    def varint(self, value: int) -> None:
        self.out += varint_bytes(value)

    def binary(self, data: bytes, what: str) -> None:
        if len(data) > STRING_BYTES_MAX:
            raise ValueError(f"{what}: {len(data)} bytes exceed {STRING_BYTES_MAX}")
        self.u16(len(data))
        self.out += data

    def string(self, text: str, what: str) -> None:
        data = encode_utf8(text, what)
        self.u16(len(data))
        self.out += data
