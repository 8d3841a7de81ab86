"""Rendering of `streamq ctl` results: aligned tables for people, JSON for scripts."""

from __future__ import annotations

import json

import pytest

from streamq.ctlhttp.output import Done, Fields, Table, Value, cell, render, render_table


def test_columns_are_aligned_and_numbers_right_aligned() -> None:
    rows = [
        {"name": "orders", "messages": 12, "durable": True},
        {"name": "q", "messages": 3456, "durable": False},
    ]
    assert render_table(("name", "messages", "durable"), rows) == [
        "name    messages  durable",
        "orders        12  true",
        "q           3456  false",
    ]


def test_no_line_ends_in_spaces() -> None:
    lines = render_table(("a", "b"), [{"a": "a-long-value", "b": None}])
    assert lines == ["a             b", "a-long-value"]


def test_an_empty_listing_is_its_header() -> None:
    assert render(Table(("user", "tags")), "table") == "user  tags\n"
    assert render(Table(("user", "tags")), "json") == "[]\n"


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, ""),
        ("", '""'),
        ("a b", "a b"),
        ("two\nlines\tand tab", "two\\nlines\\tand tab"),
        (True, "true"),
        (0, "0"),
        (1.5, "1.5"),
        (["administrator", "monitoring"], "[administrator, monitoring]"),
        ([], "[]"),
        ({"max-length": 5}, '{"max-length": 5}'),
    ],
)
def test_cells(value: object, text: str) -> None:
    assert cell(value) == text  # type: ignore[arg-type]  # object: the JSON values and more


def test_a_column_with_text_is_left_aligned_even_with_numbers() -> None:
    rows = [{"v": 1}, {"v": "x"}]
    assert render_table(("v",), rows) == ["v", "1", "x"]


def test_json_table_is_one_object_per_line_in_column_order() -> None:
    table = Table(("user", "tags"), [{"tags": ["a"], "user": "bob", "extra": 1}, {"user": "x"}])
    text = render(table, "json")
    assert text.splitlines() == [
        "[",
        '{"user": "bob", "tags": ["a"]},',
        '{"user": "x", "tags": null}',
        "]",
    ]
    assert json.loads(text) == [{"user": "bob", "tags": ["a"]}, {"user": "x", "tags": None}]


def test_fields_align_their_values() -> None:
    fields = Fields({"version": "0.1", "connections": 3, "node": None})
    assert render(fields, "table") == "version      0.1\nconnections  3\nnode\n"
    assert json.loads(render(fields, "json")) == {"version": "0.1", "connections": 3, "node": None}


def test_confirmations_print_only_for_people() -> None:
    assert render(Done('Added user "bob".'), "table") == 'Added user "bob".\n'
    assert render(Done('Added user "bob".'), "json") == ""


def test_values_print_as_text_or_json() -> None:
    assert render(Value("h4sh", "h4sh"), "table") == "h4sh\n"
    assert render(Value("h4sh", "h4sh"), "json") == '"h4sh"\n'
    assert render(Value({"users": []}, "{...}"), "json") == '{\n  "users": []\n}\n'


def test_unicode_names_keep_their_characters() -> None:
    text = render(Table(("name",), [{"name": "åäö"}]), "json")
    assert "åäö" in text
