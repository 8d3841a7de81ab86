"""Methods a connection sent before, kept decoded: the same payload skips the decoder.

kombu redeclares Celery's `rpc://` reply queue (and the task queue) before every task it
sends, the same `queue.declare` bytes each time, and the generic table-driven decoder
(`method_frame.decode_method`, the argument table above all) was the largest part of the
broker's CPU per redeclare (issue 30; docs/benchmarks.md, "Broker CPU per operation").

This module owns `MethodMemo`, one per connection. Rules:
1. Only a payload that decoded without error is kept; an error is raised again by the
   decoder each time, so a memo never changes what a payload decodes to.
2. A kept method's field tables hold scalars only (no nested table or array), and every
   hit returns a new method with copies of its tables: a handler that keeps a table (a
   new queue's arguments) shares it with no other call. Methods without tables are
   frozen and immutable, and are returned as they are.
3. Bounded: at most MEMO_ENTRIES_MAX payloads of at most MEMO_PAYLOAD_MAX bytes; when
   full it starts again empty. An idle connection holds nothing (the dict is made on the
   first kept method).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from decimal import Decimal
from operator import attrgetter
from typing import Any, Final

from amqp_gateway.codec.method_frame import decode_method
from amqp_gateway.codec.methods import METHOD_TYPES, AnyMethod
from amqp_gateway.codec.spec import METHODS, Kind

MEMO_ENTRIES_MAX: Final = 8
MEMO_PAYLOAD_MAX: Final = 256

_SCALARS: Final = (bool, int, float, Decimal, str, bytes, type(None))


@dataclasses.dataclass(frozen=True, slots=True)
class _Layout:
    """How to copy one method type: its fields' values in wire order (the order its
    constructor takes them) and which of them are tables."""

    values: Callable[[AnyMethod], tuple[Any, ...]]
    tables: tuple[int, ...]


def _layout(key: tuple[int, int]) -> _Layout | None:
    fields = METHODS[key].fields
    if not fields:
        return None
    names = [field.name for field in fields]
    getter = attrgetter(*names)
    values = getter if len(names) > 1 else (lambda method: (getter(method),))
    tables = tuple(index for index, field in enumerate(fields) if field.kind is Kind.TABLE)
    return _Layout(values, tables)


_LAYOUTS: Final[dict[type[AnyMethod], _Layout | None]] = {
    kind: _layout(key) for key, kind in METHOD_TYPES.items()
}


class MethodMemo:
    """The decoded methods of one connection's recent payloads (module rules 1-3)."""

    __slots__ = ("_kept",)

    def __init__(self) -> None:
        self._kept: dict[bytes, AnyMethod] | None = None

    def decode(self, payload: bytes) -> AnyMethod:
        """`decode_method(payload)`, from the memo when this payload was seen; raises as
        `decode_method` does."""
        kept = self._kept
        if kept is not None:
            method = kept.get(payload)
            if method is not None:
                return _fresh(method)
        method = decode_method(payload)
        if len(payload) <= MEMO_PAYLOAD_MAX and type(payload) is bytes and _keepable(method):
            if kept is None or len(kept) >= MEMO_ENTRIES_MAX:
                kept = self._kept = {}
            kept[payload] = method
            return _fresh(method)
        return method


def _keepable(method: AnyMethod) -> bool:
    layout = _LAYOUTS.get(type(method))
    if layout is None:
        return True  # no fields at all
    values = layout.values(method)
    return all(
        all(isinstance(value, _SCALARS) for value in values[index].values())
        for index in layout.tables
    )


def _fresh(method: AnyMethod) -> AnyMethod:
    layout = _LAYOUTS.get(type(method))
    if layout is None or not layout.tables:
        return method
    values = list(layout.values(method))
    for index in layout.tables:
        values[index] = dict(values[index])
    return type(method)(*values)
