"""A real broker for the fuzz modules whose parser is only reachable through it
(definitions import, the stream protocol's commands, the HTTP API): opened in a fresh
temporary data directory (under /dev/shm when there is one: inputs make the broker
fsync), driven on one event loop of its own, and replaced by a fresh one every
`inputs_per_broker` inputs, so that what a million inputs declare never piles up.

Errors the broker logs with a traceback (an internal error caught by a gateway's last
resort handler) are findings too: `logged_errors` collects the ERROR records with
exception info, and each module asserts it stays empty.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Coroutine
from typing import Any, Final, TypeVar

from streamq.broker.broker import Broker

T = TypeVar("T")
SHM: Final = "/dev/shm"
# tools/fuzz.sh makes a scratch directory for a soak and removes it after: libFuzzer ends
# the process without running Python's cleanups.
SCRATCH_ENV: Final = "STREAMQ_FUZZ_SCRATCH"


def scratch() -> str | None:
    """Where inputs' directories go: the soak's scratch directory, else /dev/shm (the
    brokers fsync), else the default temporary directory (None)."""
    if os.environ.get(SCRATCH_ENV):
        return os.environ[SCRATCH_ENV]
    return SHM if os.path.isdir(SHM) and os.access(SHM, os.W_OK) else None


class ErrorRecords(logging.Handler):
    """Keeps every ERROR record that carries a traceback."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info is not None:
            self.records.append(record)


class BrokerHost:
    """One broker at a time on one event loop; `broker` is the current one."""

    def __init__(self, inputs_per_broker: int) -> None:
        self.inputs_per_broker = inputs_per_broker
        self.loop = asyncio.new_event_loop()
        self.errors = ErrorRecords()
        logging.getLogger().addHandler(self.errors)
        self._inputs = 0
        self._directory = ""
        self.broker = self._open()
        self.on_new_broker: list[Callable[[Broker], None]] = []

    def _open(self) -> Broker:
        self._directory = tempfile.mkdtemp(prefix="streamq-fuzz-broker-", dir=scratch())
        atexit.register(shutil.rmtree, self._directory, ignore_errors=True)
        return Broker(self._directory, direct_io=False)

    def next_input(self) -> Broker:
        """The broker for the next input: a fresh one every `inputs_per_broker`. What was
        logged before (by other tests in the same process) is not this input's."""
        self.errors.records.clear()
        self._inputs += 1
        if self._inputs % self.inputs_per_broker == 0:
            self.close()
            self.broker = self._open()
            for hook in self.on_new_broker:
                hook(self.broker)
        return self.broker

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coroutine)

    def settle(self) -> None:
        """Let the callbacks and tasks an input scheduled run (one loop turn and a half)."""
        self.loop.run_until_complete(asyncio.sleep(0))

    def logged_errors(self) -> list[str]:
        found = [
            f"{r.name}: {r.getMessage()}\n{logging.Formatter().formatException(r.exc_info)}"
            for r in self.errors.records
            if r.exc_info is not None
        ]
        self.errors.records.clear()
        return found

    def close(self) -> None:
        self.run(self.broker.aclose())
        shutil.rmtree(self._directory, ignore_errors=True)
