"""How long a follower whose copy is already complete takes to rejoin the ISR, with cold
checksum caches (every file hashed on both sides: what every reconnect cost before the
cache) and then warm ones (`streamq/cluster/checksums.py`).

Usage: python benchmarks/catchup.py [--gib N] [--dir DIR] [--keep]

Makes a leader data directory of N GiB (64 MiB files, as sealed segments, plus a few
small ones) and a copy of it for the follower, then runs a real ReplicationServer and
ReplicationClient over loopback (an in-memory ISR store instead of etcd) and times,
from the follower's start to its entry into the ISR: once with no cache file and empty
in-process caches, then again with the caches the first run left. The files were just
written, so most of them are in the page cache: the cold figure is a best case for
hashing everything.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Final

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streamq.cluster import checksums
from streamq.cluster.follower import ReplicationClient
from streamq.cluster.leader import ReplicationServer
from streamq.log.tap import FileTap

FILE_BYTES: Final = 64 << 20
CHUNK_BYTES: Final = 1 << 20
SECRET: Final = "benchmark-secret"
JOIN_TIMEOUT_S: Final = 3600.0
POLL_S: Final = 0.05


class IsrStore:
    """The leader's ISR writes, kept in memory."""

    def __init__(self) -> None:
        self.isr: frozenset[str] = frozenset()

    async def set_isr(self, ids: frozenset[str]) -> bool:
        self.isr = ids
        return True


def make_directory(root: Path, gib: float) -> int:
    """Fills `root` with `gib` GiB of distinct 64 MiB files; returns the bytes written."""
    (root / "vhosts" / "v").mkdir(parents=True)
    count = max(1, int(gib * (1 << 30) // FILE_BYTES))
    for index in range(count):
        block = index.to_bytes(8, "little") * (CHUNK_BYTES // 8)
        with (root / "vhosts" / "v" / f"{index:08d}.seg").open("wb") as out:
            for chunk in range(FILE_BYTES // CHUNK_BYTES):
                out.write(chunk.to_bytes(8, "little") + block[8:])
    (root / "definitions.json").write_text("{}")
    return count * FILE_BYTES


def age(root: Path) -> None:
    """Every file's mtime set back past the cache's racy window (written a while ago)."""
    then = time.time() - 60
    for path in root.rglob("*"):
        if path.is_file():
            os.utime(path, (then, then))


async def rejoin(leader_root: Path, follower_root: Path) -> float:
    """Seconds from a follower's start to its entry into the leader's ISR."""
    store = IsrStore()
    server = ReplicationServer(FileTap(str(leader_root)), "leader", SECRET, store,
                               lease_valid=lambda: True)  # fmt: skip
    port = await server.start("127.0.0.1", 0)
    client = ReplicationClient(str(follower_root), "follower", SECRET, f"tcp://127.0.0.1:{port}")
    started = time.monotonic()
    task = asyncio.create_task(client.run())
    try:
        while "follower" not in store.isr:
            if task.done() or time.monotonic() - started > JOIN_TIMEOUT_S:
                raise RuntimeError(f"the follower did not join: {task}")
            await asyncio.sleep(POLL_S)
        return time.monotonic() - started
    finally:
        client.stop()
        await asyncio.wait_for(task, JOIN_TIMEOUT_S)
        await server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=2.0)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="leave the directories")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="streamq-catchup-", dir=args.dir))
    leader_root, follower_root = base / "leader", base / "follower"
    try:
        written = make_directory(leader_root, args.gib)
        shutil.copytree(leader_root, follower_root)
        age(leader_root)
        age(follower_root)
        for root in (leader_root, follower_root):
            (root / checksums.CACHE_FILE).unlink(missing_ok=True)
        checksums._caches.clear()  # a fresh process on each side: nothing cached
        cold = asyncio.run(rejoin(leader_root, follower_root))
        warm = asyncio.run(rejoin(leader_root, follower_root))
        size = f"{written / (1 << 30):.1f} GiB in {written // FILE_BYTES} files"
        print(f"{size}: rejoin with cold caches {cold:.2f} s, warm caches {warm:.2f} s")
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
