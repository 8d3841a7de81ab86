"""tests/ports.py: the ports the tests give to the processes they start are below the
ephemeral range, free, and never given twice while the process that reserved them runs,
whichever process asks (pytest-xdist's workers are processes)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from tests.ports import PORT_END, PORT_FIRST, free_port

ROOT = Path(__file__).resolve().parents[2]
PORTS_EACH = 300
CHILD_TIMEOUT_S = 60


def test_ports_are_in_the_range_and_bindable_and_distinct() -> None:
    ports = [free_port() for _ in range(PORTS_EACH)]
    assert len(set(ports)) == PORTS_EACH
    assert all(PORT_FIRST <= port < PORT_END for port in ports)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports[-1]))


def test_a_port_reserved_here_is_not_given_to_another_process() -> None:
    mine = {free_port() for _ in range(PORTS_EACH)}
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "from tests.ports import free_port\n"
            f"print(*(free_port() for _ in range({PORTS_EACH})))",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=CHILD_TIMEOUT_S,
        check=True,
    )
    theirs = {int(port) for port in child.stdout.split()}
    assert len(theirs) == PORTS_EACH
    assert not mine & theirs


def listening_in_the_range() -> socket.socket:
    """A listener on a port of the range that nobody reserved."""
    for port in range(PORT_END - 1, PORT_FIRST, -1):
        try:
            return socket.create_server(("127.0.0.1", port))
        except OSError:
            continue
    raise AssertionError("no port of the range is free")


def test_a_port_something_listens_on_is_not_given() -> None:
    with listening_in_the_range() as server:
        taken = server.getsockname()[1]
        child = subprocess.run(
            [
                sys.executable,
                "-c",
                "import tests.ports as p\n"
                f"first, real = [{taken}], p._random.randrange\n"
                "p._random.randrange = lambda a, b: first.pop() if first else real(a, b)\n"
                "print(p.free_port(), first)",
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=CHILD_TIMEOUT_S,
            check=True,
        )
    port, tried = child.stdout.split()
    assert tried == "[]"  # the child drew the listened-on port first
    assert int(port) != taken
