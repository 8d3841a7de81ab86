"""http_gateway.listing: RabbitMQ's sort, filter, page and columns on plain items, with
the error kinds and texts RabbitMQ 3.10 answers (checked against a running 3.10.8)."""

from __future__ import annotations

import pytest

from http_gateway.listing import (
    PAGE_SIZE_DEFAULT,
    Item,
    PagingError,
    listed,
    paging_of,
    selected,
    sort_key,
)


def items(*names: str) -> list[Item]:
    return [{"name": n, "vhost": "/", "stats": {"n": len(n)}} for n in names]


def names(answer: object) -> list[object]:
    assert isinstance(answer, list)
    return [i["name"] for i in answer]


def test_no_parameters_keep_the_list_as_it_is() -> None:
    given = items("b", "a", "c")
    assert listed(given, {}, pageable=True) == given


def test_name_filters_only_pages() -> None:
    assert names(listed(items("ab", "cd"), {"name": "a"}, pageable=True)) == ["ab", "cd"]


def test_page_shape() -> None:
    got = listed(items(*"abcde"), {"page": "2", "page_size": "2"}, pageable=True)
    assert got == {
        "total_count": 5,
        "item_count": 2,
        "filtered_count": 5,
        "page": 2,
        "page_size": 2,
        "page_count": 3,
        "items": items("c", "d"),
    }


def test_page_size_defaults_to_100() -> None:
    got = listed(items(*[f"q{i:03d}" for i in range(150)]), {"page": "2"}, pageable=True)
    assert isinstance(got, dict)
    assert got["page_size"] == PAGE_SIZE_DEFAULT and got["item_count"] == 50
    assert got["page_count"] == 2


def test_name_filter_substring_and_regex_case_insensitive() -> None:
    given = items("Orders", "orders.dlq", "payments")
    got = listed(given, {"page": "1", "name": "ORDER"}, pageable=True)
    assert isinstance(got, dict)
    assert names(got["items"]) == ["Orders", "orders.dlq"]
    assert got["filtered_count"] == 2 and got["total_count"] == 3
    got = listed(given, {"page": "1", "name": "^o.*s$", "use_regex": "true"}, pageable=True)
    assert isinstance(got, dict) and names(got["items"]) == ["Orders"]
    # Without use_regex the name is literal text.
    got = listed(given, {"page": "1", "name": "^o"}, pageable=True)
    assert isinstance(got, dict) and got["items"] == []


def test_sort_by_field_dotted_and_reverse() -> None:
    given = items("ccc", "a", "bb")
    assert names(listed(given, {"sort": "name"}, pageable=True)) == ["a", "bb", "ccc"]
    assert names(listed(given, {"sort": "stats.n", "sort_reverse": "true"}, pageable=True)) == [
        "ccc",
        "bb",
        "a",
    ]
    assert names(listed(given, {"sort_reverse": "true"}, pageable=True)) == ["bb", "a", "ccc"]
    assert names(listed(given, {"sort": ""}, pageable=True)) == ["ccc", "a", "bb"]


def test_sort_mixed_kinds_in_erlang_order() -> None:
    given: list[Item] = [{"v": "s"}, {"v": None}, {"v": [1]}, {"v": 2}, {"v": {"a": 1}}, {}]
    ordered = listed(given, {"sort": "v"}, pageable=False)
    # a missing field sorts as 0, before 2
    assert ordered == [{}, {"v": 2}, {"v": None}, {"v": {"a": 1}}, {"v": [1]}, {"v": "s"}]
    assert sort_key(True) < sort_key({}) < sort_key("") and sort_key(10**9) < sort_key(None)


def test_sort_then_page() -> None:
    query = {"sort": "name", "page": "1", "page_size": "2"}
    got = listed(items("c", "a", "b"), query, pageable=True)
    assert isinstance(got, dict) and names(got["items"]) == ["a", "b"]


def test_columns_on_lists_and_pages() -> None:
    given = items("a")
    assert listed(given, {"columns": "name"}, pageable=True) == [{"name": "a"}]
    assert listed(given, {"columns": "name,stats.n,missing"}, pageable=True) == [
        {"name": "a", "stats": {"n": 1}}
    ]
    got = listed(given, {"columns": "stats", "page": "1"}, pageable=True)
    assert isinstance(got, dict) and got["items"] == [{"stats": {"n": 1}}]
    assert selected([{"a": [{"b": 1, "c": 2}]}], [["a", "b"]]) == [{"a": [{"b": 1}]}]


def test_not_pageable_ignores_page() -> None:
    given = items("b", "a")
    assert listed(given, {"page": "1", "sort": "name"}, pageable=False) == items("a", "b")


def test_empty_first_page_and_page_after_a_full_last_one() -> None:
    got = listed([], {"page": "1"}, pageable=True)
    assert isinstance(got, dict) and got["items"] == [] and got["page_count"] == 0
    got = listed(items("a"), {"page": "2", "page_size": "1"}, pageable=True)
    assert isinstance(got, dict) and got["items"] == [] and got["page_count"] == 1


@pytest.mark.parametrize(
    ("query", "kind", "reason"),
    [
        (
            {"page": "0"},
            "invalid_pagination_parameters",
            "Invalid pagination parameters: page number 0, page size undefined",
        ),
        (
            {"page": "1", "page_size": "501"},
            "invalid_pagination_parameters",
            "Invalid pagination parameters: page number 1, page size 501",
        ),
        (
            {"page": "1", "page_size": "0"},
            "invalid_pagination_parameters",
            "Invalid pagination parameters: page number 1, page size 0",
        ),
        ({"page": "abc"}, "bad_request", "Pagination parameters are invalid"),
        ({"page": "1", "page_size": "x"}, "bad_request", "Pagination parameters are invalid"),
        (
            {"page": "1", "name": "(", "use_regex": "true"},
            "bad_request",
            "Pagination parameters are invalid",
        ),
        (
            {"page": "3"},
            "page_out_of_range",
            "Page out of range, page: 3 page size: 100, len: 0",
        ),
    ],
)
def test_bad_parameters(query: dict[str, str], kind: str, reason: str) -> None:
    with pytest.raises(PagingError) as raised:
        listed([], query, pageable=True)
    assert raised.value.status == 400
    assert (raised.value.kind, raised.value.reason) == (kind, reason)


def test_paging_of_without_page_is_none() -> None:
    assert paging_of({"page_size": "5", "name": "x"}) is None
