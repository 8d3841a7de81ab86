"""The loopback ports that tests choose for processes they start (RabbitMQ, etcd, `streamq
serve`, cluster nodes), or to find nothing listening: each one given to one caller only,
across the workers of a parallel run and across runs side by side.

Picking "a port the kernel gave to bind(0), closed again" races: another worker's bind(0)
or free_port may take it before the process that was meant to listen there does, or while
a test restarts that process. So the ports come from a range below Linux's ephemeral range
(ip_local_port_range, 32768-60999 by default), which the kernel never hands to a bind(0)
or a connect(); a port is reserved by a lock on its byte of one file (RESERVATIONS, POSIX
record locks: released when the process that holds them ends, however it ends), and is
given only if nothing is bound to it. A process keeps its reservations until it ends.
Listeners that bind port 0 themselves (the in-process brokers) need none of this.
"""

from __future__ import annotations

import fcntl
import os
import random
import socket
import tempfile
import threading
from pathlib import Path
from typing import Final

PORT_FIRST: Final = 20_000
PORT_END: Final = 32_768  # the first port of Linux's default ephemeral range
# Well-known ports in the range, of brokers a developer may run beside the tests.
PORTS_AVOIDED: Final = frozenset({25672, 25552, 27017})
RESERVATIONS: Final = Path(tempfile.gettempdir()) / "streamq-test-ports.lock"
ATTEMPTS_MAX: Final = 1_000

_random = random.SystemRandom()  # a test that seeds `random` must not make workers agree
_guard = threading.Lock()
_reserved: set[int] = set()  # this process's: its own locks never conflict with each other
_files: list[int] = []  # the one descriptor, open for the process's life (closing drops locks)


def free_port() -> int:
    """A loopback port nothing is bound to, reserved for this process until it ends."""
    with _guard:
        if not _files:
            _files.append(os.open(RESERVATIONS, os.O_RDWR | os.O_CREAT, 0o666))
        for _ in range(ATTEMPTS_MAX):
            port = _random.randrange(PORT_FIRST, PORT_END)
            if port in _reserved or port in PORTS_AVOIDED:
                continue
            try:
                fcntl.lockf(_files[0], fcntl.LOCK_EX | fcntl.LOCK_NB, 1, port)
            except OSError:
                continue  # another process has it
            if _bindable(port):
                _reserved.add(port)
                return port
            fcntl.lockf(_files[0], fcntl.LOCK_UN, 1, port)
        raise RuntimeError(f"no free loopback port in {PORT_FIRST}-{PORT_END - 1}")


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True
