"""RabbitMQ's sorting, filtering, paging and column selection of list endpoints.

Owns the query parameters every list route shares (`sort`, `sort_reverse`, `columns`, and
with `page`: `page_size`, `name`, `use_regex`) and the paged answer's shape
(`filtered_count`, `item_count`, `items`, `page`, `page_count`, `page_size`,
`total_count`). As in RabbitMQ: without `page` the answer is the plain list (filters by
`name` apply to pages only); `sort` names a field (dotted for nested ones, a missing one
sorts as 0) and the sort is stable, so ties keep the route's own order; `sort_reverse`
reverses the result; `columns` keeps the named fields (dotted for nested ones) of each
item, or of the one object a route such as the overview answers; `disable_stats=true`
drops the statistics (`message_stats`, rates, and the message counts unless
`enable_queue_totals=true`). RabbitMQ's range queries (`lengths_age`, `msg_rates_age`...:
samples of past values) are refused with a 400 by `refuse_sample_ranges`: streamq keeps
no history of samples. Pure functions of the items and the query; routes call
`list_response` or `object_response`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from aiohttp import web

from http_gateway.errors import HttpError
from http_gateway.fields import query_flag

PAGE_SIZE_DEFAULT: Final = 100  # RabbitMQ's ?DEFAULT_PAGE_SIZE
PAGE_SIZE_MAX: Final = 500  # RabbitMQ's ?MAX_PAGE_SIZE
NAME_FILTER_CHARS_MAX: Final = 1000  # a longer regex is refused, not compiled
PARAMETERS_INVALID: Final = "Pagination parameters are invalid"  # RabbitMQ's text

Item = dict[str, object]
# RabbitMQ's range parameters (rabbit_mgmt_util:range/1); each asks for `samples`.
SAMPLE_RANGE_PARAMETERS: Final = tuple(
    f"{kind}_{part}"
    for kind in ("lengths", "msg_rates", "data_rates", "node_stats")
    for part in ("age", "incr")
)
SAMPLES_REFUSED: Final = "streamq keeps no samples of past values: {} is not supported"
# What `disable_stats=true` leaves out; the counts stay with `enable_queue_totals=true`.
STATS_KEYS: Final = frozenset({"message_stats"})
QUEUE_TOTALS: Final = frozenset({"messages", "messages_ready", "messages_unacknowledged"})


class PagingError(HttpError):
    """A 400 with RabbitMQ's own `error` field (`invalid_pagination_parameters`,
    `page_out_of_range`, `bad_request`)."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(400, reason)
        self.kind = kind


@dataclass(frozen=True, slots=True)
class Paging:
    page: int
    page_size: int
    name: str
    use_regex: bool


def _int_or_none(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def paging_of(query: Mapping[str, str]) -> Paging | None:
    """The paging a query asks for, None without `page`. Raises PagingError with
    RabbitMQ's texts: a page or page size that is not an integer, a page below 1, a page
    size outside 1..500."""
    page_text = query.get("page")
    if page_text is None:
        return None
    size_text = query.get("page_size")
    page = _int_or_none(page_text)
    size = PAGE_SIZE_DEFAULT if size_text is None else _int_or_none(size_text)
    if page is None or size is None:
        raise PagingError("bad_request", PARAMETERS_INVALID)
    if page < 1 or not 0 < size <= PAGE_SIZE_MAX:
        raise PagingError(
            "invalid_pagination_parameters",
            f"Invalid pagination parameters: page number {page}, "
            f"page size {size_text if size_text is not None else 'undefined'}",
        )
    name = query.get("name", "")
    if len(name) > NAME_FILTER_CHARS_MAX:
        raise PagingError(
            "bad_request", f"name filters are at most {NAME_FILTER_CHARS_MAX} characters"
        )
    return Paging(page, size, name, query_flag(query, "use_regex"))


def _dotted(item: object, path: Sequence[str]) -> object:
    """The value at a dotted path; missing: 0 (sorts first, as in RabbitMQ)."""
    for key in path:
        if not isinstance(item, dict) or key not in item:
            return 0
        item = item[key]
    return item


def sort_key(value: object) -> tuple[int, object]:
    """Erlang's term order, which RabbitMQ sorts by: numbers < atoms (true, false,
    null) < objects < lists < strings; mixed kinds never compare directly."""
    if isinstance(value, bool) or value is None:
        return (1, str(value).lower())
    if isinstance(value, int | float):
        return (0, value)
    if isinstance(value, str):
        return (4, value)
    if isinstance(value, dict):
        return (2, json.dumps(value, sort_keys=True, default=str))
    return (3, json.dumps(value, sort_keys=True, default=str))


def sorted_items(items: list[Item], query: Mapping[str, str]) -> list[Item]:
    """`sort` (a field, dotted for nested ones; empty: no sort) and `sort_reverse`."""
    field = query.get("sort")
    if field:
        path = field.split(".")
        items = sorted(items, key=lambda item: sort_key(_dotted(item, path)))
    if query_flag(query, "sort_reverse"):
        items = items[::-1]
    return items


def _matcher(paging: Paging) -> re.Pattern[str]:
    if paging.use_regex:
        try:
            return re.compile(paging.name, re.IGNORECASE)
        except re.error:
            raise PagingError("bad_request", PARAMETERS_INVALID) from None
    return re.compile(re.escape(paging.name), re.IGNORECASE)


def filtered(items: list[Item], paging: Paging) -> list[Item]:
    """The items whose `name` contains `paging.name` (case-insensitive), or matches it
    as a regex with `use_regex=true`; all of them for an empty name."""
    if not paging.name:
        return items
    pattern = _matcher(paging)
    return [i for i in items if isinstance(i.get("name"), str) and pattern.search(str(i["name"]))]


def page_of(items: list[Item], paging: Paging) -> dict[str, object]:
    """RabbitMQ's paged answer. Raises PagingError past the last page (page 1 of
    nothing, and the page right after a full last one, are empty pages)."""
    shown = filtered(items, paging)
    first = (paging.page - 1) * paging.page_size
    if first > len(shown):
        raise PagingError(
            "page_out_of_range",
            f"Page out of range, page: {paging.page} page size: {paging.page_size}, "
            f"len: {len(shown)}",
        )
    chunk = shown[first : first + paging.page_size]
    return {
        "total_count": len(items),
        "item_count": len(chunk),
        "filtered_count": len(shown),
        "page": paging.page,
        "page_size": paging.page_size,
        "page_count": (len(shown) + paging.page_size - 1) // paging.page_size,
        "items": chunk,
    }


def _columns(query: Mapping[str, str]) -> list[list[str]] | None:
    text = query.get("columns")
    if text is None:
        return None
    return [c.split(".") for c in text.split(",") if c]


def selected(value: object, columns: list[list[str]]) -> object:
    """The named fields of an object (recursively for dotted names; a list: of each of
    its elements), as RabbitMQ's `extract_column_items`."""
    if isinstance(value, list):
        return [selected(v, columns) for v in value]
    if not isinstance(value, dict):
        return value
    out = {}
    for key, inner in value.items():
        below = [c[1:] for c in columns if c[0] == key]
        if not below:
            continue
        out[key] = inner if any(not c for c in below) else selected(inner, below)
    return out


def refuse_sample_ranges(query: Mapping[str, str]) -> None:
    """Raises HttpError 400 if `query` asks for samples (`lengths_age`...)."""
    for name in SAMPLE_RANGE_PARAMETERS:
        if name in query:
            raise HttpError(400, SAMPLES_REFUSED.format(name))


def without_stats(item: Item, keep_totals: bool) -> Item:
    """`item` without its statistics: what RabbitMQ leaves out with `disable_stats`."""
    return {
        key: value
        for key, value in item.items()
        if key not in STATS_KEYS
        and not (key.endswith("_details") and isinstance(value, dict) and "rate" in value)
        and not (key in QUEUE_TOTALS and not keep_totals)
    }


def listed(items: list[Item], query: Mapping[str, str], *, pageable: bool) -> object:
    """The JSON a list route answers: without statistics when asked, sorted, and paged
    when asked (and `pageable`), with the asked columns."""
    if query_flag(query, "disable_stats"):
        totals = query_flag(query, "enable_queue_totals")
        items = [without_stats(item, totals) for item in items]
    items = sorted_items(items, query)
    paging = paging_of(query) if pageable else None
    columns = _columns(query)
    if paging is None:
        return items if columns is None else [selected(i, columns) for i in items]
    out = page_of(items, paging)
    if columns is not None:
        out["items"] = selected(out["items"], columns)
    return out


def list_response(
    request: web.Request, items: list[Item], *, pageable: bool = True
) -> web.Response:
    """A list route's answer; `pageable=False` where RabbitMQ only sorts (users,
    consumers, the connections and channels of one vhost or connection)."""
    try:
        return web.json_response(listed(items, request.query, pageable=pageable))
    except PagingError as exc:
        return web.json_response({"error": exc.kind, "reason": exc.reason}, status=400)


def object_response(request: web.Request, item: Item) -> web.Response:
    """One object's answer, with the asked `columns` (RabbitMQ's `show overview`)."""
    columns = _columns(request.query)
    return web.json_response(item if columns is None else selected(item, columns))
