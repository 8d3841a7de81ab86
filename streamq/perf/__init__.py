"""`streamq perf`: a load generator that speaks AMQP 0-9-1 itself (issue 4)."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(commands: Any) -> None:
    """Register `streamq perf` and its subcommands on the top-level parser."""
    commands.add_parser("perf", help="load generator (not yet available)")


def main(args: argparse.Namespace) -> int:
    print("streamq perf: not available yet")
    return 2
