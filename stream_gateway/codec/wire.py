"""Primitive types of the stream protocol: big-endian integers, strings, bytes, arrays.

`Reader` walks one frame's body and raises only `MalformedFrame` (truncation, bad UTF-8,
negative lengths); `Writer` appends to one `bytearray`. Strings are `int16 length | UTF-8`,
bytes are `int32 length | content`, arrays `int32 count | items`; a length of -1 is null.
"""

from __future__ import annotations

import struct
from typing import Final

from stream_gateway.codec.errors import MalformedFrame

_U8: Final = struct.Struct(">B")
_U16: Final = struct.Struct(">H")
_I16: Final = struct.Struct(">h")
_U32: Final = struct.Struct(">I")
_I32: Final = struct.Struct(">i")
_U64: Final = struct.Struct(">Q")
_I64: Final = struct.Struct(">q")

NULL_LENGTH: Final = -1
ARRAY_COUNT_MAX: Final = 1 << 24
"""Arrays longer than this are refused before any allocation (each item is >= 1 byte, and a
frame is far smaller than 16 MiB items in any sane frame_max)."""


class Reader:
    """A cursor over one frame's bytes; every read checks the bytes are there."""

    __slots__ = ("_end", "_view", "position")

    def __init__(self, data: bytes | bytearray | memoryview, position: int = 0) -> None:
        self._view = memoryview(data)
        self._end = len(self._view)
        self.position = position

    @property
    def remaining(self) -> int:
        return self._end - self.position

    def _take(self, fmt: struct.Struct, what: str) -> int:
        if self.position + fmt.size > self._end:
            raise MalformedFrame(
                f"truncated frame: {what} needs {fmt.size} bytes at {self.position}"
            )
        (value,) = fmt.unpack_from(self._view, self.position)
        self.position += fmt.size
        assert isinstance(value, int)
        return value

    def u8(self, what: str = "uint8") -> int:
        return self._take(_U8, what)

    def u16(self, what: str = "uint16") -> int:
        return self._take(_U16, what)

    def i16(self, what: str = "int16") -> int:
        return self._take(_I16, what)

    def u32(self, what: str = "uint32") -> int:
        return self._take(_U32, what)

    def i32(self, what: str = "int32") -> int:
        return self._take(_I32, what)

    def u64(self, what: str = "uint64") -> int:
        return self._take(_U64, what)

    def i64(self, what: str = "int64") -> int:
        return self._take(_I64, what)

    def raw(self, size: int, what: str) -> bytes:
        if size < 0 or self.position + size > self._end:
            raise MalformedFrame(f"truncated frame: {what} needs {size} bytes at {self.position}")
        data = bytes(self._view[self.position : self.position + size])
        self.position += size
        return data

    def rest(self) -> bytes:
        return self.raw(self.remaining, "rest")

    def nullable_string(self, what: str = "string") -> str | None:
        size = self.i16(what)
        if size == NULL_LENGTH:
            return None
        if size < 0:
            raise MalformedFrame(f"{what}: negative string length {size}")
        try:
            return self.raw(size, what).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MalformedFrame(f"{what}: invalid UTF-8") from exc

    def string(self, what: str = "string") -> str:
        # Clients send null (-1) for an absent publisher reference; it reads as "".
        value = self.nullable_string(what)
        return "" if value is None else value

    def nullable_bytes(self, what: str = "bytes") -> bytes | None:
        size = self.i32(what)
        if size == NULL_LENGTH:
            return None
        if size < 0:
            raise MalformedFrame(f"{what}: negative bytes length {size}")
        return self.raw(size, what)

    def count(self, what: str) -> int:
        count = self.i32(what)
        if count < 0 or count > min(ARRAY_COUNT_MAX, self.remaining):
            raise MalformedFrame(f"{what}: array count {count} out of range")
        return count

    def string_map(self, what: str) -> dict[str, str]:
        return {self.string(what): self.string(what) for _ in range(self.count(what))}

    def expect_end(self, what: str) -> None:
        if self.remaining:
            raise MalformedFrame(f"{what}: {self.remaining} unexpected trailing bytes")


class Writer:
    """Appends stream protocol primitives to a caller's bytearray."""

    __slots__ = ("out",)

    def __init__(self, out: bytearray) -> None:
        self.out = out

    def u8(self, value: int) -> None:
        self.out += _U8.pack(value)

    def u16(self, value: int) -> None:
        self.out += _U16.pack(value)

    def i16(self, value: int) -> None:
        self.out += _I16.pack(value)

    def u32(self, value: int) -> None:
        self.out += _U32.pack(value)

    def i32(self, value: int) -> None:
        self.out += _I32.pack(value)

    def u64(self, value: int) -> None:
        self.out += _U64.pack(value)

    def i64(self, value: int) -> None:
        self.out += _I64.pack(value)

    def raw(self, data: bytes) -> None:
        self.out += data

    def nullable_string(self, value: str | None) -> None:
        if value is None:
            self.i16(NULL_LENGTH)
            return
        encoded = value.encode("utf-8")
        if len(encoded) > 0x7FFF:
            raise ValueError(f"string of {len(encoded)} bytes exceeds int16 length")
        self.i16(len(encoded))
        self.out += encoded

    def string(self, value: str) -> None:
        self.nullable_string(value)

    def nullable_bytes(self, value: bytes | None) -> None:
        if value is None:
            self.i32(NULL_LENGTH)
            return
        self.i32(len(value))
        self.out += value

    def string_map(self, values: dict[str, str]) -> None:
        self.i32(len(values))
        for key, value in values.items():
            self.string(key)
            self.string(value)
