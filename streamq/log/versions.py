"""The refusal of files written by a newer streamq: one check for every versioned file kind.

Every binary file kind under the data directory starts with a magic and a u16 format
version (accounts.json has a `version` key); docs/operations.md lists them. A reader
accepts the versions it knows (older ones are read, some rewritten in the current one)
and refuses a higher version with `NewerFormat`, which names the file, both versions and
this streamq's version. It is deliberately not a LogError, OSError or BrokerError: the
handlers that skip a damaged vhost or queue at start-up do not catch it, so an older
streamq stops (`streamq serve` exits with the message) instead of serving a data
directory without the parts it cannot read, and rewriting them.
"""

from __future__ import annotations

import streamq


class NewerFormat(Exception):
    """A file's format version is above the highest this streamq reads."""

    def __init__(self, path: str, kind: str, found: int, supported: int) -> None:
        super().__init__(
            f"{path}: {kind} format version {found} was written by a newer streamq (or the"
            f" header is damaged); this streamq ({streamq.__version__}) reads {kind} format"
            f" versions up to {supported}."
            " Run the newer streamq on this data directory, or restore a backup made by"
            " this version"
        )
        self.path = path
        self.kind = kind
        self.found = found
        self.supported = supported


def refuse_newer(path: str, kind: str, found: int, supported: int) -> None:
    """Raise NewerFormat if `found` is above `supported`."""
    if found > supported:
        raise NewerFormat(path, kind, found, supported)
