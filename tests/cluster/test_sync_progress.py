"""A follower's full sync logs its progress: files received of those it asked for, over
real loopback sockets from an in-process leader (streamq/progress.py, interval 0: a line
per file)."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamq import progress
from tests.cluster.replication_helpers import Follower, Leader, MemoryIsrStore, eventually

pytestmark = pytest.mark.timeout(120)

FILES = 12


@pytest.fixture
def every_item() -> Iterator[None]:
    before = progress.interval_s()
    progress.set_interval_s(0)
    yield
    progress.set_interval_s(before)


@pytest.mark.usefixtures("every_item")
async def test_full_sync_logs_files_of_the_total(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="streamq.cluster.follower")
    leader = Leader(tmp_path / "leader", MemoryIsrStore())
    for i in range(FILES):
        leader.workload.write(f"log/file{i}.seg", 0, bytes([i]) * 5000)
    await leader.start()
    follower = Follower(tmp_path / "f1", "f1", leader.uri)
    try:
        await eventually(lambda: follower.client.synced)
    finally:
        await follower.stop()
        await leader.server.close()
    lines = [r for r in caplog.records if r.name == "streamq.cluster.follower"]
    prefix = f"clustering: full sync from {leader.uri}: "
    assert lines and all(r.getMessage().startswith(prefix) for r in lines)
    *steps, last = lines
    total = steps[0].__dict__["progress"]["total"]
    assert total >= FILES  # the files written, and whatever else the leader's tree holds
    assert [r.__dict__["progress"]["done"] for r in steps] == list(range(1, total + 1))
    assert re.fullmatch(rf"{total} of {total} files done in \w+", last.getMessage()[len(prefix) :])
