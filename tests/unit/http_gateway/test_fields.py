"""http_gateway.fields reads booleans and integers as RabbitMQ's management plugin does
(`rabbit_mgmt_util:parse_bool/1`, `parse_int/1`, checked against RabbitMQ 3.10.8): the
JSON types, and the strings rabbitmqadmin sends, and nothing looser."""

from __future__ import annotations

import re

import pytest

from http_gateway.errors import HttpError
from http_gateway.fields import boolean, bounded_integer, flag, integer, query_flag


@pytest.mark.parametrize(
    ("value", "expected"),
    [(True, True), (False, False), ("true", True), ("false", False)],
)
def test_booleans_accepted(value: object, expected: bool) -> None:
    assert boolean(value) is expected


@pytest.mark.parametrize(
    "value", ["True", "FALSE", "yes", "1", "0", "", " true", 1, 0, None, [], {}, 1.0]
)
def test_booleans_refused(value: object) -> None:
    # RabbitMQ 3.10.8 answers each of these {"reason": ["not_boolean", value]}.
    assert boolean(value) is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [(5, 5), (-1, -1), (2.0, 2), ("10", 10), ("+10", 10), ("-3", -3), ("007", 7)],
)
def test_integers_accepted(value: object, expected: int) -> None:
    found = integer(value)
    assert found == expected and type(found) is int


@pytest.mark.parametrize(
    "value",
    [
        True,
        False,
        None,
        "",
        " 1",
        "1 ",
        "1.5",
        "1_000",
        "0x10",
        "١٢",  # Arabic-Indic digits, which Python's int() would take
        "1" * 21,
        1.5,
        float("inf"),
        float("nan"),
        [1],
    ],
)
def test_integers_refused(value: object) -> None:
    assert integer(value) is None


def test_flag_defaults_only_when_absent() -> None:
    assert flag({}, "durable", True) is True
    assert flag({"durable": "false"}, "durable", True) is False
    with pytest.raises(HttpError, match=r"^durable must be true or false$") as refused:
        flag({"durable": None}, "durable", True)  # RabbitMQ refuses an explicit null too
    assert refused.value.status == 400
    with pytest.raises(HttpError, match=re.escape("internal must be true or false in {'x': 1}")):
        flag({"internal": "no"}, "internal", False, where=" in {'x': 1}")


def test_bounded_integer_names_the_range() -> None:
    assert bounded_integer("3", "count", 1, 10) == 3
    with pytest.raises(HttpError, match=r"^count must be an integer from 1 to 10$"):
        bounded_integer("11", "count", 1, 10)
    with pytest.raises(HttpError, match=r"^count must be an integer from 1 to 10$"):
        bounded_integer(None, "count", 1, 10)
    with pytest.raises(HttpError, match=r"^truncate must be a non-negative integer$"):
        bounded_integer("-1", "truncate", 0)
    with pytest.raises(HttpError, match=r"^n must be an integer of at least 2$"):
        bounded_integer(1, "n", 2)


def test_query_flag() -> None:
    assert query_flag({"if-unused": "true"}, "if-unused") is True
    assert query_flag({"if-unused": "TRUE"}, "if-unused") is True
    assert query_flag({"if-unused": "yes"}, "if-unused") is False
    assert query_flag({}, "if-unused") is False
