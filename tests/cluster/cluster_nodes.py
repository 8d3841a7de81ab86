"""A streamq cluster for the end-to-end tests and the benchmark: N `streamq serve
--clustering` processes on free loopback ports, each with a data directory of its own,
electing through one etcd (tests/cluster/etcd_server.py).

Owns `ClusterNode` (one process, restartable on the same ports and data directory, and
signalled only by its own pid: SIGKILL, SIGTERM, SIGSTOP, SIGCONT) and `Cluster` (the nodes,
which one leads, who is in sync). A node's role is read from its log lines (Contract N:
"clustering: elected leader", then "listening ..." once it serves; "clustering: following
leader ..."; "clustering: lost leadership: ..."); the in-sync set from `/api/nodes`. Every
wait is bounded and fails with the end of every node's log.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from tests.differential.peers import free_port
from tests.process_pause import pause

ROOT: Final = Path(__file__).resolve().parents[2]
LEASE_TTL_S: Final = 3  # the tests' lease: failovers in seconds, not tens of seconds
PREFIX: Final = "streamq-test"
START_TIMEOUT_S: Final = 30.0
STOP_TIMEOUT_S: Final = 20.0
HTTP_TIMEOUT_S: Final = 5.0
POLL_S: Final = 0.1
LOG_TAIL_BYTES: Final = 3000
IN_SYNC_STATES: Final = frozenset({"serving", "streaming"})  # /api/nodes `state`
START_MARK: Final = b"=== cluster_nodes: start ===\n"
ROLE_LINE: Final = re.compile(
    rb"clustering: (elected leader|lost leadership|following leader)|listening amqp="
)


class ClusterNode:
    """One `streamq serve --clustering` in `directory` (its data in `data/`, its stdout and
    stderr appended to `serve.log`), on ports chosen once so that a restart keeps them."""

    def __init__(
        self,
        name: str,
        directory: Path,
        etcd_endpoint: str,
        *,
        prefix: str = PREFIX,
        lease_ttl_s: int = LEASE_TTL_S,
        extra: tuple[str, ...] = (),
        address: str = "127.0.0.1",
        wrap: Callable[[list[str]], list[str]] | None = None,
        user: tuple[str, str] = ("guest", "guest"),
    ) -> None:
        """`address`: the one the node binds and advertises; `wrap` turns the command
        into the one to run (e.g. inside a network namespace: tests/faults/netns.py);
        `user` the API's (guest only from loopback)."""
        self.name = name
        self.address = address
        self.user = user
        self.wrap = wrap
        self.directory = directory
        self.data_dir = directory / "data"
        self.log_path = directory / "serve.log"
        directory.mkdir(parents=True, exist_ok=True)
        self.amqp_port, self.http_port, self.clustering_port = free_port(), free_port(), free_port()
        self.etcd_endpoint = etcd_endpoint
        self.prefix = prefix
        self.lease_ttl_s = lease_ttl_s
        self.extra = extra
        self.process: subprocess.Popen[bytes] | None = None
        self.paused = False
        self.code_root = ROOT  # the streamq it runs (another version's tree: an upgrade test)

    def argv(self) -> list[str]:
        return [
            sys.executable, "-m", "streamq", "serve",
            "--data-dir", str(self.data_dir), "--bind", self.address,
            "--amqp-port", str(self.amqp_port), "--http-port", str(self.http_port),
            "--stream-port", "-1", *self.mqtt_off(),
            "--clustering", "--clustering-bind", self.address,
            "--clustering-port", str(self.clustering_port),
            "--clustering-advertised-uri", f"tcp://{self.address}:{self.clustering_port}",
            "--clustering-etcd-endpoints", self.etcd_endpoint,
            "--clustering-etcd-prefix", self.prefix,
            "--clustering-lease-ttl", str(self.lease_ttl_s),
            *self.extra,
        ]  # fmt: skip

    def mqtt_off(self) -> tuple[str, ...]:
        """The flag that keeps MQTT off (its default port is fixed), for a streamq that has
        MQTT; an older one (an upgrade test's) has neither the listener nor the flag."""
        return ("--mqtt-port", "-1") if self.code_root == ROOT else ()

    def start(self) -> None:
        """Starts the process (returns at once: see Cluster's waits)."""
        assert not self.alive, f"{self.name} is already running"
        with self.log_path.open("ab") as log:
            log.write(START_MARK)
            env = {**os.environ, "PYTHONPATH": str(self.code_root)}
            argv = self.argv() if self.wrap is None else self.wrap(self.argv())
            self.process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.directory
            )
        self.paused = False

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def kill(self) -> None:
        """SIGKILL: no chance to flush, sync or resign."""
        self._signal_and_wait(signal.SIGKILL)

    def stop(self) -> None:
        """SIGTERM (after SIGCONT if paused), SIGKILL after a bound."""
        if not self.alive:
            return
        if self.paused:
            self.resume()
        try:
            self._signal_and_wait(signal.SIGTERM)
        except subprocess.TimeoutExpired:
            self._signal_and_wait(signal.SIGKILL)

    def _signal_and_wait(self, signum: int) -> None:
        assert self.process is not None
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signum)
        self.process.wait(STOP_TIMEOUT_S)
        self.paused = False

    def pause(self) -> None:
        """SIGSTOP: the process keeps its sockets and lease keep-alive task, but runs nothing."""
        pause(self.pid)
        self.paused = True

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)
        self.paused = False

    def log(self) -> bytes:
        """What the current (last started) process printed."""
        if not self.log_path.exists():
            return b""
        return self.log_path.read_bytes().rsplit(START_MARK, 1)[-1]

    def log_tail(self) -> str:
        return f"--- {self.name} ---\n" + self.log()[-LOG_TAIL_BYTES:].decode(errors="replace")

    def role(self) -> str:
        """The role from the last role lines of the current process's log: "leader"
        (elected and listening), "electing" (elected, not yet listening), "follower"
        (following a leader, or just stepped down), or "" (no role line yet)."""
        lines = ROLE_LINE.findall(self.log())
        if not lines:
            return ""
        last = lines[-1]
        if last == b"":  # a "listening" line: serving if it follows an election
            before = [line for line in lines if line]
            return "leader" if before and before[-1] == b"elected leader" else ""
        if last == b"elected leader":
            return "electing"
        return "follower"

    @property
    def node_id(self) -> str:
        return (self.data_dir / ".clustering_id").read_text().strip()

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{self.address}:{self.amqp_port}/"

    def api(self, path: str, method: str = "GET", body: object = None) -> Any:
        """The management API of this node (a follower forwards it to the leader): the
        decoded JSON answer. Raises OSError (urllib's errors) on failure."""
        return http_json(self.http_port, path, method, body, host=self.address, user=self.user)


def http_json(
    port: int,
    path: str,
    method: str = "GET",
    body: object = None,
    *,
    host: str = "127.0.0.1",
    user: tuple[str, str] = ("guest", "guest"),
) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://{host}:{port}{path}", data=data, method=method)
    token = base64.b64encode(f"{user[0]}:{user[1]}".encode()).decode()
    request.add_header("Authorization", "Basic " + token)
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
        text = response.read()
    return json.loads(text) if text else None


class ClusterTimeout(AssertionError):
    """A bounded wait ran out; the message ends with every node's log tail."""


class Cluster:
    """`size` nodes under `base`, electing through `etcd_endpoint`; `start()` starts them
    (the first alone until it leads, so that it is the first leader). Stops every node
    it started on exit."""

    def __init__(
        self,
        base: Path,
        etcd_endpoint: str,
        size: int = 3,
        *,
        lease_ttl_s: int = LEASE_TTL_S,
        extra: tuple[str, ...] = (),
    ) -> None:
        self.base = base
        self.etcd_endpoint = etcd_endpoint
        self.lease_ttl_s = lease_ttl_s
        self.extra = extra
        self.nodes: list[ClusterNode] = []
        for _ in range(size):
            self._new_node()

    def _new_node(self) -> ClusterNode:
        name = f"n{len(self.nodes)}"
        node = ClusterNode(
            name,
            self.base / name,
            self.etcd_endpoint,
            lease_ttl_s=self.lease_ttl_s,
            extra=self.extra,
        )
        self.nodes.append(node)
        return node

    def start(self, timeout_s: float = START_TIMEOUT_S) -> ClusterNode:
        """Starts every node, the first one alone until it serves; returns once all of
        them are in the in-sync set (the first leader)."""
        first = self.nodes[0]
        first.start()
        self.wait_leader(timeout_s)
        for node in self.nodes[1:]:
            node.start()
        self.wait_in_sync(self.nodes, timeout_s)
        return first

    def add_node(self) -> ClusterNode:
        """A new node with an empty data directory, started."""
        node = self._new_node()
        node.start()
        return node

    def leader(self) -> ClusterNode | None:
        """The one running, unpaused node that serves as leader (None if none or several)."""
        serving = [n for n in self.nodes if n.alive and not n.paused and n.role() == "leader"]
        return serving[0] if len(serving) == 1 else None

    def wait_leader(self, timeout_s: float, exclude: tuple[ClusterNode, ...] = ()) -> ClusterNode:
        """The serving leader, once there is one that is not in `exclude`."""
        leader = self.wait_for(
            lambda: (node := self.leader()) is not None and node not in exclude and node,
            timeout_s,
            "a serving leader",
        )
        assert isinstance(leader, ClusterNode)
        return leader

    def api_nodes(self) -> list[dict[str, Any]]:
        """`/api/nodes` of the leader (asked of the leader itself first: a follower's
        forwarder may be waiting on a leader that is gone)."""
        leader = self.leader()
        for node in ([leader] if leader else []) + self.nodes:
            if node.alive and not node.paused:
                with contextlib.suppress(OSError, ValueError):
                    answer = node.api("/api/nodes")
                    if isinstance(answer, list):
                        return answer
        return []

    def isr_ids(self) -> set[str]:
        """Node ids that /api/nodes lists as in the in-sync set and connected: the leader
        ("serving") or a follower applying the live stream ("streaming"); an id the
        leader still lists in the set while its node is down does not count."""
        return {
            node_entry_id(entry)
            for entry in self.api_nodes()
            if entry.get("in_isr") and entry.get("state") in IN_SYNC_STATES
        }

    def wait_in_sync(self, nodes: list[ClusterNode], timeout_s: float) -> None:
        def in_sync() -> bool:
            ids = set()
            for node in nodes:
                with contextlib.suppress(OSError):
                    ids.add(node.node_id)
            return len(ids) == len(nodes) and ids <= self.isr_ids()

        self.wait_for(in_sync, timeout_s, f"{[n.name for n in nodes]} in sync")

    def wait_for(self, check: Any, timeout_s: float, what: str) -> Any:
        """Polls `check()` until it returns something true (returned); bounded."""
        deadline = time.monotonic() + timeout_s
        while not (value := check()):
            if time.monotonic() > deadline:
                raise ClusterTimeout(f"no {what} within {timeout_s} s\n{self.log_tails()}")
            time.sleep(POLL_S)
        return value

    def log_tails(self) -> str:
        return "\n".join(node.log_tail() for node in self.nodes)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def node_entry_id(entry: dict[str, Any]) -> str:
    """The node id of one /api/nodes entry (Contract N: `node_id`, else the name's part
    after '@', as in RabbitMQ's "rabbit@host")."""
    if entry.get("node_id"):
        return str(entry["node_id"])
    return str(entry.get("name", "")).rpartition("@")[2]
