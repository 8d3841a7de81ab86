"""A real etcd for the clustering tests: Debian's `etcd-server` (3.4), started by the tests
on free loopback client and peer ports with a data directory of its own, and stopped by its
pid. `pause()`/`resume()` (SIGSTOP/SIGCONT) let a test make etcd unresponsive without
closing its sockets, as a partition or a stalled disk would."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from tests.differential.peers import free_port
from tests.process_pause import pause

ETCD = Path("/usr/bin/etcd")
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


def etcd_ready(endpoint: str) -> bool:
    """True once etcd answers a read through its v3 JSON gateway (it has a raft leader)."""
    request = urllib.request.Request(f"http://{endpoint}/v3/kv/range", data=b'{"key":"AA=="}')
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError):
        return False


class EtcdServer:
    """One single-member etcd in `directory`, on loopback ports chosen here; `.endpoint` is
    "127.0.0.1:PORT". Raises RuntimeError, with the end of its log, if it does not start."""

    def __init__(
        self,
        directory: Path,
        *,
        address: str = "127.0.0.1",
        wrap: Callable[[list[str]], list[str]] | None = None,
    ) -> None:
        """`address`: where it listens; `wrap` turns its command into the one to run
        (e.g. inside a network namespace: tests/faults/netns.py)."""
        if not ETCD.exists():
            raise RuntimeError(
                f"{ETCD} is missing: `make test` installs Debian's etcd-server "
                "(as root), or run `sudo apt-get install etcd-server` once"
            )
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.client_port, self.peer_port = free_port(), free_port()
        self.address = address
        self.wrap = wrap
        self.endpoint = f"{address}:{self.client_port}"
        self._start()

    def _start(self) -> None:
        client_url = f"http://{self.endpoint}"
        peer_url = f"http://{self.address}:{self.peer_port}"
        name = "streamq-test"
        self.output = open(self.directory / "etcd.out", "ab")  # noqa: SIM115 (closed in stop)
        argv = [
            str(ETCD),
            "--name",
            name,
            "--data-dir",
            str(self.directory / "data"),
            "--listen-client-urls",
            client_url,
            "--advertise-client-urls",
            client_url,
            "--listen-peer-urls",
            peer_url,
            "--initial-advertise-peer-urls",
            peer_url,
            "--initial-cluster",
            f"{name}={peer_url}",
        ]
        self.process = subprocess.Popen(
            argv if self.wrap is None else self.wrap(argv),
            stdout=self.output,
            stderr=subprocess.STDOUT,
        )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not etcd_ready(self.endpoint):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"etcd did not start:\n{self.log_tail()}")
            time.sleep(0.1)

    def log_tail(self) -> str:
        return (self.directory / "etcd.out").read_bytes().decode(errors="replace")[-4000:]

    def pause(self) -> None:
        """SIGSTOP: etcd keeps its sockets open but answers nothing."""
        pause(self.process.pid)

    def resume(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        """SIGTERM (after SIGCONT, in case it is paused), SIGKILL after a bound."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGCONT)
                self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(STOP_TIMEOUT_S)
        self.output.close()

    def restart(self, down_s: float = 0.0) -> None:
        """Stops etcd and starts it again `down_s` later on the same ports and data (its
        keys and leases survive; clients see their connections break)."""
        self.stop()
        time.sleep(down_s)
        self._start()

    def __enter__(self) -> EtcdServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
