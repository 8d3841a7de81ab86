"""One vhost's MQTT state kept in a file replaced whole on change: the write side that
the retained messages, the QoS 2 identifiers and the PUBREL state share.

Owns `StateFile`: the file's path, a count of the changes made in memory and of those
the file holds, and `flush`, which writes the state (temp file, fsync, rename, fsync the
directory: `streamq.log.files.write_file_atomic`, which a cluster's file tap records) on
a worker thread, never on the event loop. Changes made while a write runs go in the next
one, so a burst of changes costs a few writes; `flush()` returns once every change made
before the call is durable. The stores own their state and its encoding; this knows
neither.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

from streamq.log.files import write_file_atomic


class StateFile:
    """The durable copy of one store's state, written whole."""

    __slots__ = ("_changes", "_lock", "_written", "path")

    def __init__(self, directory: str, name: str) -> None:
        self.path = os.path.join(directory, name)
        self._changes = 0  # counts changes; `_written` is the count the file holds
        self._written = 0
        self._lock = asyncio.Lock()

    def read(self) -> bytes | None:
        """The file's bytes, None when there is none yet."""
        try:
            with open(self.path, "rb") as file:
                return file.read()
        except FileNotFoundError:
            return None

    def changed(self) -> None:
        """Count one change of the state in memory (durable after `flush`)."""
        self._changes += 1

    @property
    def dirty(self) -> bool:
        """Whether a change is not on disk yet."""
        return self._written < self._changes

    async def flush(self, encode: Callable[[], bytes]) -> None:
        """Return once every change made before the call is on disk, written as
        `encode()` returns it then. Raises OSError (OutOfSpace among them)."""
        target = self._changes
        async with self._lock:
            if self._written >= target:
                return
            changes = self._changes
            data = encode()
            await asyncio.to_thread(write_file_atomic, self.path, data, fsync_dir=True)
            self._written = changes
