"""A three-node RabbitMQ cluster on this machine, for `benchmarks/cluster_compare.py`.

Usage: python benchmarks/rabbitmq_cluster.py [--dir DIR] [--nodes N]   (starts, prints, stops)

Owns `RabbitMQCluster`: N Debian rabbitmq-server nodes (`rabbit1@localhost`, ...), each with
its own AMQP, management, and Erlang distribution ports (free loopback ports) and its own
mnesia, log and config directories under DIR; one Erlang port mapper (epmd) on a port of
our own shared by the nodes (so a RabbitMQ the machine may already run is never touched),
and one Erlang cookie, written by us into the HOME all nodes and `rabbitmqctl` share. The
first node boots alone; every other one boots, then `rabbitmqctl stop_app`, `join_cluster
rabbit1@localhost`, `start_app`. Every process is one we started and is stopped by its pid
(`RabbitMQServer.stop`'s order: SIGTERM to the Erlang VM, SIGKILL after a bound); our epmd
is asked to stop through its own port once the last node is down.

Quorum queues are declared by the client with `x-queue-type: quorum` (durable); their
initial group size is the cluster's size, so each holds a replica on every node.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Final

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.differential.peers import (
    RABBITMQ_SERVER,
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    Endpoint,
    RabbitMQServer,
    free_port,
)

RABBITMQCTL: Final = RABBITMQ_SERVER.with_name("rabbitmqctl")
NODES_DEFAULT: Final = 3
CTL_TIMEOUT_S: Final = 120.0  # join_cluster waits for mnesia to sync with the seed node
QUORUM_ARGS: Final = '{"x-queue-type":"quorum"}'


class ClusterNode(RabbitMQServer):
    """One node of the cluster: RabbitMQServer's start, wait, log and stop, with the epmd
    port and HOME (the cookie) of the cluster instead of its own."""

    def __init__(self, directory: Path, index: int, home: Path, epmd_port: int) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.amqp_port, self.http_port = free_port(), free_port()
        self.epmd_port, dist_port = epmd_port, free_port()
        self.node = f"rabbit{index}@localhost"
        self.endpoint = Endpoint(self.node, self.amqp_port, self.http_port)
        self.amqps_port = -1
        (directory / "rabbitmq.conf").write_text(
            f"listeners.tcp.1 = 127.0.0.1:{self.amqp_port}\n"
            f"management.tcp.port = {self.http_port}\n"
            "management.tcp.ip = 127.0.0.1\n"
            "log.console = false\n"
        )
        (directory / "enabled_plugins").write_text("[rabbitmq_management].\n")
        self.env = node_env(directory, self.node, home, epmd_port, dist_port)
        self.output = open(directory / "server.out", "wb")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(
            [str(RABBITMQ_SERVER)], env=self.env, stdout=self.output, stderr=subprocess.STDOUT
        )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def ctl(self, *args: str) -> str:
        """`rabbitmqctl -n NODE ARGS` with this node's environment; raises RuntimeError
        with its output if it fails."""
        command = [str(RABBITMQCTL), "-n", self.node, *args]
        out = subprocess.run(
            command,
            check=False,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=CTL_TIMEOUT_S,
        )
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} on {self.node}: {out.stdout}{out.stderr}")
        return out.stdout

    def stop(self) -> None:
        """SIGTERM to the VM, SIGKILL after a bound; the shared epmd is left running."""
        beam = self._beam_pid()
        if beam is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(beam, signal.SIGTERM)
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            if beam is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(beam, signal.SIGKILL)
            self.process.kill()
            self.process.wait(STOP_TIMEOUT_S)
        self.output.close()


def node_env(
    directory: Path, node: str, home: Path, epmd_port: int, dist_port: int
) -> dict[str, str]:
    return {
        **os.environ,
        "HOME": str(home),  # .erlang.cookie: the same for every node and rabbitmqctl
        "RABBITMQ_NODENAME": node,
        "RABBITMQ_DIST_PORT": str(dist_port),
        "ERL_EPMD_PORT": str(epmd_port),
        "ERL_EPMD_ADDRESS": "127.0.0.1",
        "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        "RABBITMQ_MNESIA_BASE": str(directory / "mnesia"),
        "RABBITMQ_LOG_BASE": str(directory / "log"),
        "RABBITMQ_CONFIG_FILE": str(directory / "rabbitmq.conf"),
        "RABBITMQ_ADVANCED_CONFIG_FILE": str(directory / "advanced.config"),
        "RABBITMQ_CONF_ENV_FILE": str(directory / "rabbitmq-env.conf"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(directory / "enabled_plugins"),
        "RABBITMQ_PLUGINS_EXPAND_DIR": str(directory / "plugins-expand"),
        "RABBITMQ_PID_FILE": str(directory / "pid"),
    }


def write_cookie(home: Path) -> None:
    home.mkdir(parents=True, exist_ok=True)
    cookie = home / ".erlang.cookie"
    cookie.write_text(secrets.token_hex(16).upper())
    cookie.chmod(0o400)  # Erlang refuses a cookie others can read


class RabbitMQCluster:
    """`nodes` RabbitMQ nodes clustered together under `directory`; `stop()` stops them all.
    Raises RuntimeError (with the log's end) if a node does not start or join."""

    def __init__(self, directory: Path, nodes: int = NODES_DEFAULT) -> None:
        if not RABBITMQ_SERVER.exists():
            raise RuntimeError(f"{RABBITMQ_SERVER} is missing: apt-get install rabbitmq-server")
        self.home = directory / "home"
        write_cookie(self.home)
        self.epmd_port = free_port()
        self.nodes: list[ClusterNode] = []
        try:
            for index in range(1, nodes + 1):
                node = ClusterNode(directory / f"rabbit{index}", index, self.home, self.epmd_port)
                self.nodes.append(node)
                if index > 1:
                    self._join(node)
            self._wait_members(nodes)
        except BaseException:
            self.stop()
            raise

    def _join(self, node: ClusterNode) -> None:
        node.ctl("stop_app")
        node.ctl("join_cluster", self.nodes[0].node)
        node.ctl("start_app")

    def _wait_members(self, count: int) -> None:
        """Until the first node lists `count` running nodes (bounded)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            status = self.nodes[0].ctl("cluster_status", "--formatter", "json")
            running = running_nodes(status)
            if running >= count:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {running} of {count} nodes running:\n{status}")
            time.sleep(0.5)

    @property
    def amqp_ports(self) -> list[int]:
        return [node.amqp_port for node in self.nodes]

    def stop(self) -> None:
        """Every node by its VM's pid (last joined first), then our epmd."""
        for node in reversed(self.nodes):
            node.stop()
        self.nodes = []
        epmd = shutil.which("epmd")
        if epmd is not None:
            env = {**os.environ, "ERL_EPMD_PORT": str(self.epmd_port), "HOME": str(self.home)}
            subprocess.run(
                [epmd, "-kill"], check=False, env=env, capture_output=True, timeout=STOP_TIMEOUT_S
            )

    def __enter__(self) -> RabbitMQCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def running_nodes(status_json: str) -> int:
    """How many nodes `rabbitmqctl cluster_status --formatter json` lists as running."""
    value = json.loads(status_json)
    return len(value.get("running_nodes", []))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, help="where the nodes live (a fresh temp dir)")
    parser.add_argument("--nodes", type=int, default=NODES_DEFAULT)
    args = parser.parse_args(argv)
    base = args.dir or Path(tempfile.mkdtemp(prefix="rabbitmq-cluster-"))
    started = time.monotonic()
    with RabbitMQCluster(base, args.nodes) as cluster:
        took_s = time.monotonic() - started
        print(f"{args.nodes} nodes clustered in {took_s:.1f} s; AMQP ports {cluster.amqp_ports}")
        print(cluster.nodes[0].ctl("cluster_status"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
