"""Fixtures of the clustering tests: a real etcd per test (function scope: tests pause and
stop it), on free loopback ports with its directory under `tmp_path`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.etcd_server import EtcdServer


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    with EtcdServer(tmp_path / "etcd") as server:
        yield server
