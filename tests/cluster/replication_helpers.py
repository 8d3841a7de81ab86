"""Helpers for the replication tests: a leader (a real FileTap and ReplicationServer on a
loopback port), followers (ReplicationClient tasks), a workload that changes the leader's
directory and records each change on the tap (as streamq.log.files does), an in-memory
IsrStore, a TCP relay that can be paused, and the tree comparison."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Self

from streamq.cluster.follower import ReplicationClient
from streamq.cluster.leader import ReplicationServer
from streamq.log.tap import LOCAL_FILES, FileTap

SECRET = "s3cret"
WAIT_S = 20.0


async def eventually(condition: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def tree(root: Path) -> dict[str, bytes | None]:
    """Every directory (None) and file (its bytes) under root but the node-local files."""
    found: dict[str, bytes | None] = {}
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root).as_posix()
        if relative.split("/")[0] in LOCAL_FILES:
            continue
        found[relative] = None if path.is_dir() else path.read_bytes()
    return found


class MemoryIsrStore:
    """An IsrStore in memory: the test can make it fail, refuse, or wait."""

    def __init__(self) -> None:
        self.isr: frozenset[str] | None = None
        self.writes: list[frozenset[str]] = []
        self.fail = False
        self.refuse = False
        self.gate = asyncio.Event()
        self.gate.set()

    async def set_isr(self, ids: frozenset[str]) -> bool:
        await self.gate.wait()
        if self.fail:
            raise ConnectionError("etcd is unavailable")
        if self.refuse:
            return False
        self.isr = ids
        self.writes.append(ids)
        return True


class Workload:
    """Changes files under the leader's root and records each change on the tap."""

    def __init__(self, root: Path, tap: FileTap) -> None:
        self.root = root
        self.tap = tap

    def path(self, relative: str) -> str:
        return str(self.root / relative)

    def write(self, relative: str, position: int, data: bytes) -> None:
        full = self.path(relative)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        fd = os.open(full, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, data, position)
        finally:
            os.close(fd)
        self.tap.write(full, position, data)

    def append(self, relative: str, data: bytes) -> None:
        full = self.path(relative)
        size = os.path.getsize(full) if os.path.exists(full) else 0
        self.write(relative, size, data)

    def truncate(self, relative: str, size: int) -> None:
        os.truncate(self.path(relative), size)
        self.tap.truncate(self.path(relative), size)

    def rename(self, src: str, dst: str) -> None:
        os.replace(self.path(src), self.path(dst))
        self.tap.rename(self.path(src), self.path(dst))

    def remove(self, relative: str) -> None:
        os.remove(self.path(relative))
        self.tap.remove(self.path(relative))

    def mkdir(self, relative: str) -> None:
        os.makedirs(self.path(relative), exist_ok=True)
        self.tap.mkdir(self.path(relative))

    def remove_tree(self, relative: str) -> None:
        shutil.rmtree(self.path(relative))
        self.tap.remove_tree(self.path(relative))

    def mixed(self, rounds: int, seed: int = 0) -> None:
        """A little of everything the broker does: segment appends, a journal rewritten
        by rename, a queue directory created and deleted, a cut tail."""
        for i in range(seed, seed + rounds):
            self.append("log/00000000.seg", bytes([i % 251]) * (1000 + i % 7000))
            self.write(f"queues/q{i % 3}/journal.tmp", 0, f"journal {i}".encode() * 20)
            self.rename(f"queues/q{i % 3}/journal.tmp", f"queues/q{i % 3}/journal")
            if i % 5 == 0:
                self.mkdir(f"queues/tmp{i}")
                self.write(f"queues/tmp{i}/x", 0, b"x" * 100)
            if i % 5 == 2:
                self.remove_tree(f"queues/tmp{i - 2}")
            if i % 7 == 3:
                segment = self.path("log/00000000.seg")
                self.truncate("log/00000000.seg", os.path.getsize(segment) - 10)


class Leader:
    def __init__(
        self,
        root: Path,
        store: MemoryIsrStore,
        *,
        ack_timeout_s: float = 3.0,
        retain_bytes_max: int = 256 << 20,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.tap = FileTap(str(root), retain_bytes_max=retain_bytes_max)
        self.lease_ok = True
        self.server = ReplicationServer(
            self.tap,
            "leader",
            SECRET,
            store,
            lease_valid=lambda: self.lease_ok,
            ack_timeout_s=ack_timeout_s,
            tls=tls,
        )
        self.workload = Workload(root, self.tap)
        self.port = 0

    async def start(self) -> Leader:
        self.port = await self.server.start("127.0.0.1", 0)
        return self

    @property
    def uri(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def round(self) -> asyncio.Future[BaseException | None]:
        """A round through the gate, as the Syncer makes one: its result is the gate's."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[BaseException | None] = loop.create_future()

        def done(exc: BaseException | None) -> None:
            loop.call_soon_threadsafe(_settle, future, exc)

        self.server.hold(done)
        return future


def _settle(future: asyncio.Future[BaseException | None], exc: BaseException | None) -> None:
    if not future.done():
        future.set_result(exc)


class Follower:
    """A ReplicationClient running as a task."""

    def __init__(
        self,
        root: Path,
        node_id: str,
        uri: str,
        secret: str = SECRET,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.client = ReplicationClient(str(root), node_id, secret, uri, tls)
        self.task = asyncio.create_task(self.client.run())

    async def stop(self) -> None:
        self.client.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.task, WAIT_S)


class Relay:
    """A loopback TCP relay between a follower and the leader that the test can pause
    (bytes then wait in the relay's kernel buffers, as with a stalled follower)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> Self:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def uri(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        pumps = [
            asyncio.create_task(self._pump(reader, up_writer, upstream=True)),
            asyncio.create_task(self._pump(up_reader, writer, upstream=False)),
        ]
        self._tasks.update(pumps)
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for task in pumps:
            task.cancel()
        writer.close()
        up_writer.close()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, upstream: bool
    ) -> None:
        with contextlib.suppress(OSError):  # a side hung up: the other pump ends too
            while data := await reader.read(1 << 16):
                await self.flowing.wait()
                self.carried(data, upstream=upstream)
                writer.write(data)
                await writer.drain()

    def carried(self, data: bytes, *, upstream: bool) -> None:
        """Each chunk the relay passes on (`upstream`: follower to leader); a subclass
        that records the traffic overrides it."""

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
