"""The command-line value types (streamq/argtypes.py): values and argparse's messages."""

from __future__ import annotations

import argparse

import pytest

from streamq.argtypes import non_negative_int


def test_non_negative_int_takes_zero_and_up_and_names_the_value_in_errors() -> None:
    parse = non_negative_int("a number of milliseconds")
    assert parse("0") == 0
    assert parse("1500") == 1500
    with pytest.raises(argparse.ArgumentTypeError, match="not a number of milliseconds: 'x'"):
        parse("x")
    with pytest.raises(argparse.ArgumentTypeError, match="must not be negative: -1"):
        parse("-1")


def test_a_parser_in_a_real_argument_parser_exits_with_its_message(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = argparse.ArgumentParser(prog="tool")
    parser.add_argument("--count", type=non_negative_int("a whole number"))
    assert parser.parse_args(["--count", "3"]).count == 3
    with pytest.raises(SystemExit):
        parser.parse_args(["--count", "three"])
    assert "argument --count: not a whole number: 'three'" in capsys.readouterr().err
