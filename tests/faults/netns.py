"""Test hosts on one machine: each a network namespace of its own with one address,
joined by a bridge in a hub namespace, all made by the test and removed after it
(iproute2's `ip netns`, as root). The test process reaches every host through a veth of
its own (`<prefix>r`, the subnet's .254), so its clients and the checker stay outside
every fault.

Faults between hosts are routes: a `blackhole` route to a peer's address inside a host
drops what it sends there, and the peer's replies to it (TCP to that peer then stalls,
as across a real partition); a host cut off from everyone has its link down. This
kernel has no netem qdisc, so lossy links are flapping ones: a cut set and healed on a
schedule.

Names: every namespace and root-side interface starts with `sqf` and a tag of this run,
so that runs side by side never touch each other's; a subnet 10.213.X.0/24 that no
route of the machine uses is picked at start.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from dataclasses import dataclass, field
from types import TracebackType
from typing import Final

NAME_PREFIX: Final = "sqf"
SUBNET_FIRST: Final = "10.213"
IP_TIMEOUT_S: Final = 10.0
HOSTS_MAX: Final = 200  # addresses .1 to .200 of the subnet
TAG_DIGITS: Final = 7  # a run's tag: its process id (Linux's pid_max is at most 4194304)


class NetworkError(RuntimeError):
    """An `ip` command failed: the message has the command and what it printed."""


def ip(*args: str) -> str:
    """Runs `ip ARGS` and returns what it printed; raises NetworkError if it fails."""
    done = subprocess.run(
        ["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=False
    )
    if done.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


@dataclass(slots=True)
class Host:
    """A test host: its namespace, its address, and the peers it is cut from."""

    name: str
    namespace: str
    address: str
    cut_from: set[str] = field(default_factory=set)
    link_up: bool = True

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv` as a command that runs inside this host (`ip netns exec`, which execs
        it: the process's pid is the command's own)."""
        return ["ip", "netns", "exec", self.namespace, *argv]


class Network:
    """The hub, the test's own veth, and the hosts added; `close()` removes them all."""

    def __init__(self, tag: str | None = None) -> None:
        self.tag = tag or f"{os.getpid():0{TAG_DIGITS}d}"
        self.prefix = f"{NAME_PREFIX}{self.tag}"
        self.hub = f"{self.prefix}hub"
        self.root_link = f"{self.prefix}r"
        self.subnet = _free_subnet()
        self.gateway = f"{self.subnet}.254"  # the test process's address
        self.hosts: dict[str, Host] = {}
        self._started = False

    def start(self) -> Network:
        if os.geteuid() != 0:
            raise NetworkError(
                "the fault suite's test hosts are network namespaces (ip netns), which "
                "need root: run `make test` as root, as CI does"
            )
        remove_stale()
        self._started = True
        try:
            ip("netns", "add", self.hub)
            ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
            ip("-n", self.hub, "link", "set", "br0", "up")
            ip("link", "add", self.root_link, "type", "veth", "peer", "name", "root",
               "netns", self.hub)  # fmt: skip
            ip("-n", self.hub, "link", "set", "root", "master", "br0", "up")
            ip("addr", "add", f"{self.gateway}/24", "dev", self.root_link)
            ip("link", "set", self.root_link, "up")
        except BaseException:
            self.close()
            raise
        return self

    def add_host(self, name: str) -> Host:
        """A new host `name` with the next address of the subnet, its link up."""
        index = len(self.hosts) + 1
        assert index <= HOSTS_MAX, "the subnet has no address left"
        namespace = f"{self.prefix}{name}"
        host = Host(name, namespace, f"{self.subnet}.{index}")
        ip("netns", "add", namespace)
        self.hosts[name] = host
        port = f"p{index}"
        ip("link", "add", port, "netns", self.hub, "type", "veth", "peer", "name", "eth0",
           "netns", namespace)  # fmt: skip
        ip("-n", self.hub, "link", "set", port, "master", "br0", "up")
        ip("-n", namespace, "link", "set", "lo", "up")
        ip("-n", namespace, "addr", "add", f"{host.address}/24", "dev", "eth0")
        ip("-n", namespace, "link", "set", "eth0", "up")
        return host

    # -- faults ------------------------------------------------------------------------

    def cut(self, a: Host, b: Host) -> None:
        """a and b no longer reach each other (both ways); everyone else still does."""
        for here, there in ((a, b), (b, a)):
            if there.name not in here.cut_from:
                ip("-n", here.namespace, "route", "add", "blackhole", f"{there.address}/32")
                here.cut_from.add(there.name)

    def mend(self, a: Host, b: Host) -> None:
        """Undoes `cut(a, b)`."""
        for here, there in ((a, b), (b, a)):
            if there.name in here.cut_from:
                ip("-n", here.namespace, "route", "del", "blackhole", f"{there.address}/32")
                here.cut_from.discard(there.name)

    def split(self, side: list[Host], other: list[Host]) -> None:
        """Every host of `side` cut from every host of `other`."""
        for a in side:
            for b in other:
                self.cut(a, b)

    def set_link(self, host: Host, *, up: bool) -> None:
        """`host` cut from everyone, the test process included (its link down), or back."""
        ip("-n", host.namespace, "link", "set", "eth0", "up" if up else "down")
        host.link_up = up

    def heal(self) -> None:
        """Every cut mended and every link up."""
        for host in self.hosts.values():
            for other in list(host.cut_from):
                self.mend(host, self.hosts[other])
            if not host.link_up:
                self.set_link(host, up=True)

    # -- teardown ----------------------------------------------------------------------

    def close(self) -> None:
        """Removes the hosts' namespaces (their veths go with them), the hub and the
        test's own veth; what is already gone is skipped."""
        if not self._started:
            return
        for host in self.hosts.values():
            with contextlib.suppress(NetworkError):
                ip("netns", "del", host.namespace)
        with contextlib.suppress(NetworkError):
            ip("netns", "del", self.hub)
        with contextlib.suppress(NetworkError):
            ip("link", "del", self.root_link)
        self._started = False

    def __enter__(self) -> Network:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def remove_stale() -> None:
    """Removes what earlier runs left behind (a test process that was SIGKILLed never
    ran its teardown): the namespaces and root-side veths of tags whose process is gone."""
    names = [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]
    links = [
        line.split(":")[1].strip().split("@")[0]
        for line in ip("-o", "link", "show").splitlines()
        if line.count(":") >= 2
    ]
    for name in names + links:
        tag = name[len(NAME_PREFIX) : len(NAME_PREFIX) + TAG_DIGITS]
        if not name.startswith(NAME_PREFIX) or not tag.isdigit() or _running(int(tag)):
            continue
        with contextlib.suppress(NetworkError):
            if name in names:
                ip("netns", "del", name)
            else:
                ip("link", "del", name)


def _running(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def _free_subnet() -> str:
    """10.213.X for an X that no route of this machine (root namespace) uses."""
    routes = ip("-4", "route", "show", "table", "all")
    start = os.getpid() % 254  # runs side by side start their search apart
    for step in range(254):
        subnet = f"{SUBNET_FIRST}.{(start + step) % 254 + 1}"
        if f"{subnet}." not in routes:
            return subnet
    raise NetworkError(f"no free {SUBNET_FIRST}.X.0/24 subnet")
