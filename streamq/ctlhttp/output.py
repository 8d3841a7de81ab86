"""What a `streamq ctl` command prints: aligned tables, field lists, confirmations or JSON.

Owns the results a command returns (`Table`, `Fields`, `Done`, `Value`) and their two
renderings, `--format table` (for people: columns aligned with two spaces, numbers
right-aligned, a header line) and `--format json` (for scripts: the same rows as an array
of objects keyed by the column names). Pure functions from results to text: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from streamq.ctlhttp.client import JsonValue

FORMATS: Final = ("table", "json")
COLUMN_GAP: Final = "  "
# Cells stay on one line: a name with a newline or tab must not break the table's columns.
CELL_ESCAPES: Final = str.maketrans({"\n": "\\n", "\r": "\\r", "\t": "\\t"})
Row = dict[str, JsonValue]


@dataclass(frozen=True, slots=True)
class Table:
    """A listing: rows of objects, shown in `columns` order."""

    columns: tuple[str, ...]
    rows: list[Row] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Fields:
    """One object shown as `name  value` lines (`status`)."""

    values: Row


@dataclass(frozen=True, slots=True)
class Done:
    """A change that succeeded: a confirmation line for people, nothing in JSON."""

    message: str


@dataclass(frozen=True, slots=True)
class Value:
    """A value printed as `text` for people and as JSON for scripts."""

    value: JsonValue
    text: str


Result = Table | Fields | Done | Value


def render(result: Result, output_format: str) -> str:
    """The text to print (with its final newline), or "" for nothing."""
    assert output_format in FORMATS, output_format
    if output_format == "json":
        return _render_json(result)
    if isinstance(result, Table):
        return _lines(render_table(result.columns, result.rows))
    if isinstance(result, Fields):
        return _lines(render_fields(result.values))
    if isinstance(result, Done):
        return _lines([result.message])
    return _lines([result.text])


def _render_json(result: Result) -> str:
    if isinstance(result, Done):
        return ""
    if isinstance(result, Table):
        # An array with one object per line, as rabbitmqctl's JSON formatter: valid JSON
        # for scripts, still one row per line for grep.
        objects = [
            json.dumps({c: row.get(c) for c in result.columns}, ensure_ascii=False)
            for row in result.rows
        ]
        return "[\n" + ",\n".join(objects) + "\n]\n" if objects else "[]\n"
    value = result.values if isinstance(result, Fields) else result.value
    return json.dumps(value, indent=2, ensure_ascii=False) + "\n"


def _lines(lines: Sequence[str]) -> str:
    return "".join(f"{line}\n" for line in lines)


def render_table(columns: Sequence[str], rows: Sequence[Row]) -> list[str]:
    """A header line and one line per row, columns padded to their widest cell.

    Columns whose values are all numbers are right-aligned; no line has trailing spaces.
    """
    cells = [[cell(row.get(column)) for column in columns] for row in rows]
    widths = [
        max([len(column)] + [len(line[i]) for line in cells]) for i, column in enumerate(columns)
    ]
    numeric = [_is_numeric([row.get(column) for row in rows]) for column in columns]
    lines = [list(columns), *cells]
    return [
        COLUMN_GAP.join(
            text.rjust(width) if right else text.ljust(width)
            for text, width, right in zip(line, widths, numeric, strict=True)
        ).rstrip()
        for line in lines
    ]


def render_fields(values: Row) -> list[str]:
    """`name  value` lines, the values aligned."""
    width = max((len(name) for name in values), default=0)
    return [
        f"{name.ljust(width)}{COLUMN_GAP}{cell(value)}".rstrip() for name, value in values.items()
    ]


def cell(value: JsonValue) -> str:
    """One value as a table cell: `""` for an empty string (an empty regex, the default
    exchange), lists as `[a, b]`, objects as compact JSON, nothing for a missing value."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value.translate(CELL_ESCAPES) if value else '""'
    if isinstance(value, list):
        return "[" + ", ".join(cell(item) for item in value) + "]"
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False).translate(CELL_ESCAPES)
    return str(value)


def _is_numeric(values: list[JsonValue]) -> bool:
    present = [value for value in values if value is not None]
    return bool(present) and all(
        isinstance(value, int | float) and not isinstance(value, bool) for value in present
    )
