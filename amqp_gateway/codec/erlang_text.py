"""The reply texts RabbitMQ gives malformed frames, which print Erlang terms.

RabbitMQ 3.10 describes a frame it cannot take with `io_lib:format("type ~p, ~s octets =
~p: ~p", [Type, "all" | "first 16", Payload, Reason])` (rabbit_reader:frame_error/5, and
unexpected_frame/4 without the reason). A client sees that text in connection.close, so
we print the same: at most 16 payload octets as an Erlang binary, and the reason as an
Erlang atom or a tuple of an atom and integers.

`~p` breaks a term that does not fit an 80-column line. The rules below reproduce OTP 25's
io_lib_pretty for exactly these shapes (a binary of up to 16 octets, then a reason), as
checked against `erl` on thousands of generated frames; other terms never reach here.

Rules: pure functions of their arguments; nothing else.
"""

from __future__ import annotations

from typing import Final

ErlangTerm = str | tuple[str | int, ...]
"""An atom (a str) or a tuple of atoms and integers."""

SNIPPET_BYTES_MAX: Final = 16  # rabbit_reader:payload_snippet/1
# The columns io_lib_pretty allows (0-based end of the line, exclusive), by case.
_FLAT_BINARY_END_MAX: Final = 81
_FILLED_ELEMENT_END_MAX: Final = 79
_FLAT_TUPLE_END_MAX: Final = 78
_ESCAPES: Final[dict[int, bytes]] = {
    8: b"\\b",
    9: b"\\t",
    10: b"\\n",
    11: b"\\v",
    12: b"\\f",
    13: b"\\r",
    27: b"\\e",
    34: b'\\"',
    92: b"\\\\",
}


def frame_error_text(frame_type: int, payload: bytes, reason: ErlangTerm) -> str:
    """RabbitMQ's FRAME_ERROR text for a frame of `frame_type`: "type 1, all octets =
    <<0,60>>: unknown_frame"."""
    text = _frame_text(frame_type, payload) + ": "
    return text + term(reason, column(text))


def unexpected_frame_text(frame_type: int, payload: bytes) -> str:
    """RabbitMQ's UNEXPECTED_FRAME text for a frame of `frame_type` where none of its
    kind may come: "type 8, all octets = <<>>"."""
    return _frame_text(frame_type, payload)


def _frame_text(frame_type: int, payload: bytes) -> str:
    which = "all" if len(payload) <= SNIPPET_BYTES_MAX else f"first {SNIPPET_BYTES_MAX}"
    text = f"type {frame_type}, {which} octets = "
    return text + _binary(payload[:SNIPPET_BYTES_MAX], column(text))


def column(text: str) -> int:
    """Where the next character of `text` goes on its last line, in bytes: Erlang counts
    the octets of a reply text, and our texts carry peer bytes as UTF-8 with
    surrogateescape (amqp_gateway/codec/values.py)."""
    line = text[text.rfind("\n") + 1 :]
    return len(line.encode("utf-8", "surrogateescape"))


def printable(data: bytes) -> bool:
    """io_lib:printable_list/1 under the default latin1 printable range, for a list of
    octets that is not empty."""
    return bool(data) and all(32 <= b <= 126 or 160 <= b <= 255 or b in _ESCAPES for b in data)


def quoted(data: bytes) -> str:
    """Printable `data` between ~p's quotes, escaped as ~p escapes it. The octets stay
    as they are (UTF-8 with surrogateescape), so the text goes out as RabbitMQ's does:
    RabbitMQ sends the Latin-1 octet itself, one byte, not its UTF-8 encoding."""
    escaped = b"".join(_ESCAPES.get(b, bytes((b,))) for b in data)
    return '"' + escaped.decode("utf-8", "surrogateescape") + '"'


def string_term(data: bytes) -> str:
    """`data` as ~p prints the list binary_to_list/1 makes of it: a quoted string when
    every octet is printable (`printable`), else the list of its codes."""
    return quoted(data) if printable(data) else "[" + ",".join(map(str, data)) + "]"


def _binary(data: bytes, column: int) -> str:
    """`data` as ~p prints it at `column`: a string when printable, else its octets,
    filled over lines indented two past `column` when they do not fit one."""
    if printable(data):
        return "<<" + quoted(data) + ">>"
    flat = "<<" + ",".join(map(str, data)) + ">>"
    if column + len(flat) <= _FLAT_BINARY_END_MAX:
        return flat
    indent = column + 2
    lines: list[str] = []
    line, start = "<<", column
    last = len(data) - 1
    for index, octet in enumerate(data):
        piece = f"{octet}>>" if index == last else f"{octet},"
        limit = _FLAT_BINARY_END_MAX if index == last else _FILLED_ELEMENT_END_MAX
        if line != "<<" and start + len(line) + len(piece) > limit:
            lines.append(line)
            line, start = "", indent
        line += piece
    lines.append(line)
    return ("\n" + " " * indent).join(lines)


def term(reason: ErlangTerm, at: int) -> str:
    """An atom, or a tuple printed at column `at` that breaks after its first element,
    the rest indented one past the brace, when it would end past column 78."""
    if isinstance(reason, str):
        return reason
    parts = [str(part) for part in reason]
    flat = "{" + ",".join(parts) + "}"
    if at + column(flat) <= _FLAT_TUPLE_END_MAX:
        return flat
    return "{" + parts[0] + ",\n" + " " * (at + 1) + ",".join(parts[1:]) + "}"
