"""A streamq cluster on test hosts for the fault suite: etcd and each node in a network
namespace of its own (tests/faults/netns.py), started with the cluster tests' helpers
(tests/cluster/etcd_server.py, cluster_nodes.py), with what the checker needs of them:

- **lease tenures**, as etcd saw them: a thread polls the election key (the oldest key
  under `<prefix>/leader/`, whose value is the leader's advertised URI) every
  LEASE_POLL_S. A tenure starts at the last poll that did not show the node and ends at
  the first that no longer does, so it holds the true one (a poll that fails, etcd being
  paused, stretches it): a confirm outside it was surely sent without a lease;
- **writes tenures**, as each node logged them: from its "listening amqp=" line after
  "clustering: elected leader" to its "clustering: lost leadership" line, cut at the
  moment the suite killed, stopped or paused it (a paused node accepts nothing; once
  resumed, what it does is judged by its confirms against its lease). The log's times
  are the node's wall clock, which the suite steps (tests/faults/clock.py: each node
  runs under libfaketime): they are mapped back to host time with the steps.

Every fault goes through here, so that it is recorded with its time (`faults`).
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final

from streamq.broker.users import hash_password
from tests.cluster.cluster_nodes import START_MARK, Cluster, ClusterNode
from tests.cluster.etcd_server import EtcdServer
from tests.faults.clients import USER, Endpoint
from tests.faults.clock import NodeClock
from tests.faults.history import Tenure
from tests.faults.netns import Host, Network

LEASE_TTL_S: Final = 3
LEASE_POLL_S: Final = 0.1
ETCD_POLL_TIMEOUT_S: Final = 0.5
START_TIMEOUT_S: Final = 60.0
LOG_LINE: Final = re.compile(
    rb"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) \S+ \S+: "
    rb"(clustering: elected leader|clustering: lost leadership|listening amqp=)",
    re.MULTILINE,
)


@dataclass(frozen=True, slots=True)
class Fault:
    """A fault the suite injected or healed, for the report."""

    at: float
    kind: str
    target: str


class FaultCluster:
    """etcd and `size` nodes, each on a host of its own; `close()` undoes everything."""

    def __init__(self, base: Path, size: int = 3, *, lease_ttl_s: int = LEASE_TTL_S) -> None:
        self.base = base
        self.size = size
        self.lease_ttl_s = lease_ttl_s
        self.network = Network()
        self.faults: list[Fault] = []
        self.hosts: dict[str, Host] = {}
        self.clocks: dict[str, NodeClock] = {}  # node name -> its wall clock
        self.etcd: EtcdServer | None = None
        self.cluster: Cluster | None = None
        self._cuts: dict[str, list[float]] = {}  # node name -> kill/stop/pause times
        self._watcher: LeaseWatcher | None = None

    def start(self) -> FaultCluster:
        try:
            self.network.start()
            etcd_host = self.hosts["etcd"] = self.network.add_host("etcd")
            self.etcd = EtcdServer(
                self.base / "etcd", address=etcd_host.address, wrap=etcd_host.wrap
            )
            self.cluster = Cluster(self.base, self.etcd.endpoint, 0, lease_ttl_s=self.lease_ttl_s)
            config = ("--config", str(write_user_config(self.base)))
            for index in range(self.size):
                name = f"n{index}"
                host = self.hosts[name] = self.network.add_host(name)
                clock = self.clocks[name] = NodeClock(self.base / f"{name}.clock")
                self.cluster.nodes.append(
                    ClusterNode(
                        name, self.base / name, self.etcd.endpoint,
                        lease_ttl_s=self.lease_ttl_s, address=host.address,
                        wrap=lambda argv, h=host, c=clock: h.wrap(c.wrap(argv)),
                        user=USER, extra=config,
                    )
                )  # fmt: skip
            self.cluster.start(START_TIMEOUT_S)
            uris = {
                f"tcp://{n.address}:{n.clustering_port}": node_name(n) for n in self.cluster.nodes
            }
            self._watcher = LeaseWatcher(self.etcd.endpoint, self.cluster.nodes[0].prefix, uris)
            self._watcher.start()
        except BaseException:
            self.close()
            raise
        return self

    # -- what the clients and the faults use ------------------------------------------

    @property
    def nodes(self) -> list[ClusterNode]:
        assert self.cluster is not None
        return self.cluster.nodes

    def endpoints(self) -> list[Endpoint]:
        return [Endpoint(node.address, node.amqp_port) for node in self.nodes]

    def host(self, node: ClusterNode) -> Host:
        return self.hosts[node.name]

    def record(self, kind: str, target: str) -> None:
        self.faults.append(Fault(time.time(), kind, target))

    def kill(self, node: ClusterNode) -> None:
        self._cut_writes(node)
        self.record("kill", node.name)
        node.kill()

    def pause(self, node: ClusterNode) -> None:
        self._cut_writes(node)
        self.record("pause", node.name)
        node.pause()

    def resume(self, node: ClusterNode) -> None:
        self.record("resume", node.name)
        node.resume()

    def restart(self, node: ClusterNode) -> None:
        self.record("restart", node.name)
        node.start()

    def step_clock(self, node: ClusterNode, offset_s: int) -> None:
        """The node's wall clock reads host time + `offset_s` from now on."""
        self.record(f"clock {offset_s:+d} s", node.name)
        self.clocks[node.name].step(offset_s)

    def _cut_writes(self, node: ClusterNode) -> None:
        self._cuts.setdefault(node_name(node), []).append(time.time())

    # -- tenures ----------------------------------------------------------------------

    def tenures(self) -> list[Tenure]:
        """Lease tenures (etcd's view) and writes tenures (the nodes' logs) so far."""
        assert self._watcher is not None
        found = self._watcher.tenures()
        for node in self.nodes:
            cuts = self._cuts.get(node_name(node), [])
            found += writes_tenures(node, cuts, self.clocks[node.name].host_time)
        return found

    # -- teardown ---------------------------------------------------------------------

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.close()
        if self.cluster is not None:
            self.cluster.stop()
        if self.etcd is not None:
            self.etcd.stop()
        self.network.close()

    def __enter__(self) -> FaultCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def write_user_config(base: Path) -> Path:
    """A config file whose definitions give the nodes the suite's administrator USER."""
    definitions = base / "definitions.json"
    name, password = USER
    definitions.write_text(
        json.dumps(
            {
                "users": [{"name": name, "password_hash": hash_password(password),
                           "tags": "administrator"}],
                "vhosts": [{"name": "/"}],
                "permissions": [{"user": name, "vhost": "/", "configure": ".*",
                                 "write": ".*", "read": ".*"}],
            }
        )
    )  # fmt: skip
    config = base / "streamq.ini"
    config.write_text(f"[main]\nload_definitions = {definitions}\n")
    return config


def node_name(node: ClusterNode) -> str:
    """The name the node's server properties and API use."""
    return f"streamq@{node.node_id}"


def writes_tenures(
    node: ClusterNode, cuts: list[float], host_time: Callable[[float], float]
) -> list[Tenure]:
    """The node's writes tenures from its whole log (every process it ran), each ended at
    its "lost leadership" line or at the first of `cuts` after its start; `host_time`
    maps the log's times (the node's wall clock) to the host's."""
    if not node.log_path.exists():
        return []
    name = node_name(node)
    found: list[Tenure] = []
    for run in node.log_path.read_bytes().split(START_MARK):
        elected = False
        start: float | None = None
        for match in LOG_LINE.finditer(run):
            at = host_time(_log_time(match.group(1), match.group(2)))
            what = match.group(3)
            if what == b"clustering: elected leader":
                elected = True
            elif what == b"listening amqp=" and elected and start is None:
                start = at
            elif what == b"clustering: lost leadership":
                if start is not None:
                    found.append(_cut(Tenure(name, "writes", start, at), cuts))
                elected, start = False, None
        if start is not None:
            found.append(_cut(Tenure(name, "writes", start, None), cuts))
    return found


def _log_time(seconds: bytes, millis: bytes) -> float:
    parsed = time.strptime(seconds.decode(), "%Y-%m-%d %H:%M:%S")
    return time.mktime(parsed) + int(millis) / 1000


def _cut(tenure: Tenure, cuts: list[float]) -> Tenure:
    """`tenure` ended at the first cut after its start, if that comes before its end."""
    for at in sorted(cuts):
        if at >= tenure.start and (tenure.end is None or at < tenure.end):
            return Tenure(tenure.node, tenure.role, tenure.start, at)
    return tenure


class LeaseWatcher(threading.Thread):
    """Polls etcd's election key; see the module's docstring for how tenures are bounded."""

    def __init__(self, endpoint: str, prefix: str, names: dict[str, str]) -> None:
        super().__init__(name="faults-lease-watcher", daemon=True)
        self.endpoint = endpoint
        self.names = names  # advertised URI -> node name
        first = f"{prefix}/leader/".encode()
        self._query = json.dumps(
            {
                "key": base64.b64encode(first).decode(),
                "range_end": base64.b64encode(first[:-1] + b"0").decode(),
                "sort_order": "ASCEND",
                "sort_target": "CREATE",
                "limit": 1,
            }
        ).encode()
        self._done = threading.Event()
        self._closed: list[Tenure] = []
        self._holder: str | None = None
        self._since = 0.0
        self._last_asked = 0.0  # when the last answered poll was sent (0: none yet)

    def run(self) -> None:
        while not self._done.wait(LEASE_POLL_S):
            asked = time.time()
            holder = self._poll()
            if holder is False:
                continue  # no answer: the state stands, the bounds stretch
            self._observe(holder if isinstance(holder, str) else None, asked, time.time())

    def _observe(self, holder: str | None, asked: float, answered: float) -> None:
        """The answer holds for some moment between `asked` and `answered`: a holder
        that changed had let go by `answered`; the new one may have held it since the
        previous answered poll was sent."""
        if holder != self._holder:
            if self._holder is not None:
                self._closed.append(Tenure(self._holder, "lease", self._since, answered))
            self._holder = holder
            self._since = self._last_asked
        self._last_asked = asked

    def _poll(self) -> str | bool | None:
        """The leader's node name, None if there is none, False if etcd did not answer."""
        request = urllib.request.Request(f"http://{self.endpoint}/v3/kv/range", data=self._query)
        try:
            with urllib.request.urlopen(request, timeout=ETCD_POLL_TIMEOUT_S) as response:
                answer = json.loads(response.read())
        except (OSError, ValueError):
            return False
        kvs = answer.get("kvs") or []
        if not kvs:
            return None
        uri = base64.b64decode(kvs[0].get("value", "")).decode()
        return self.names.get(uri, uri)

    def tenures(self) -> list[Tenure]:
        found = list(self._closed)
        if self._holder is not None:
            found.append(Tenure(self._holder, "lease", self._since, None))
        return found

    def close(self) -> None:
        self._done.set()
        with contextlib.suppress(RuntimeError):
            self.join(ETCD_POLL_TIMEOUT_S * 4)
