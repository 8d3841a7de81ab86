"""argparse value types shared by the command-line tools (`streamq serve`, `streamq ctl`).

Pure parsing: each returns the value or raises `argparse.ArgumentTypeError` with the
one-line message argparse prints. It imports nothing of the broker.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable


def non_negative_int(what: str) -> Callable[[str], int]:
    """A parser of integers >= 0; `what` names the value in errors ("a whole number")."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
        if value < 0:
            raise argparse.ArgumentTypeError(f"must not be negative: {value}")
        return value

    return parse
