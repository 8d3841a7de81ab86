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
_ESCAPES: Final[dict[int, str]] = {
    8: "\\b",
    9: "\\t",
    10: "\\n",
    11: "\\v",
    12: "\\f",
    13: "\\r",
    27: "\\e",
    34: '\\"',
    92: "\\\\",
}


def frame_error_text(frame_type: int, payload: bytes, reason: ErlangTerm) -> str:
    """RabbitMQ's FRAME_ERROR text for a frame of `frame_type`: "type 1, all octets =
    <<0,60>>: unknown_frame"."""
    text = _frame_text(frame_type, payload) + ": "
    return text + _term(reason, _column(text))


def unexpected_frame_text(frame_type: int, payload: bytes) -> str:
    """RabbitMQ's UNEXPECTED_FRAME text for a frame of `frame_type` where none of its
    kind may come: "type 8, all octets = <<>>"."""
    return _frame_text(frame_type, payload)


def _frame_text(frame_type: int, payload: bytes) -> str:
    which = "all" if len(payload) <= SNIPPET_BYTES_MAX else f"first {SNIPPET_BYTES_MAX}"
    text = f"type {frame_type}, {which} octets = "
    return text + _binary(payload[:SNIPPET_BYTES_MAX], _column(text))


def _column(text: str) -> int:
    return len(text) - (text.rfind("\n") + 1)


def _printable(data: bytes) -> bool:
    # io_lib:printable_list/1 under the default latin1 printable range.
    return bool(data) and all(32 <= b <= 126 or 160 <= b <= 255 or b in _ESCAPES for b in data)


def _binary(data: bytes, column: int) -> str:
    """`data` as ~p prints it at `column`: a string when printable, else its octets,
    filled over lines indented two past `column` when they do not fit one."""
    if _printable(data):
        return '<<"' + "".join(_ESCAPES.get(b, chr(b)) for b in data) + '">>'
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


def _term(reason: ErlangTerm, column: int) -> str:
    """An atom, or a tuple that breaks after its first element when it does not fit."""
    if isinstance(reason, str):
        return reason
    parts = [str(part) for part in reason]
    flat = "{" + ",".join(parts) + "}"
    if column + len(flat) <= _FLAT_TUPLE_END_MAX:
        return flat
    return "{" + parts[0] + ",\n" + " " * (column + 1) + ",".join(parts[1:]) + "}"
