"""`streamq ctl`: manage users, vhosts and permissions in a data directory."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(commands: Any) -> None:
    """Register `streamq ctl` and its subcommands on the top-level parser."""
    commands.add_parser("ctl", help="manage users, vhosts and permissions (not yet available)")


def main(args: argparse.Namespace) -> int:
    print("streamq ctl: not available yet")
    return 2
