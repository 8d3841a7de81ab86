"""An older streamq refuses a data directory holding a file of a newer format version.

A fixture of tests/upgrade/data is unpacked and one file of a kind gets a format version
above the one today's streamq writes (as if a newer streamq had written it); `streamq
serve` must then exit with status 1 and a message naming the file and both versions,
without serving and without rewriting that file (docs/operations.md, "Upgrades and data
directories")."""

from __future__ import annotations

import json
import struct
import subprocess
import tarfile
from pathlib import Path

import pytest

from streamq.broker import definitions, delayed
from streamq.log import format as fmt
from streamq.log._records import crc32c
from streamq.queues import journal, offset_file, publishers
from tests.integration.broker_process import STARTUP_TIMEOUT_S, streamq

DATA = Path(__file__).parent / "data"
FIXTURE = sorted(DATA.glob("*-kill.tar.gz"))[-1]
NEWER = 99
VERSION_AT = 4  # every binary kind: 4-byte magic, then the u16 version
# kind: (glob under the data directory, the highest version this streamq reads)
KINDS = {
    "definitions": ("vhosts/*/definitions", definitions.VERSION),
    "queue journal": ("vhosts/*/queues/*.journal", journal.VERSION),
    "delayed messages": ("vhosts/*/delayed", delayed.VERSION),
    "stream offsets": ("vhosts/*/streams/*.offsets", offset_file.VERSION),
    "stream publishers": ("vhosts/*/streams/*/publishers", publishers.VERSION),
}
# Segments: (glob, which of the sorted matches, kind in the message). Indexes are not
# versioned apart: one this streamq cannot read is rebuilt from its segment.
SEGMENT_FILES = {
    "message log segment": ("vhosts/*/messages/*.seg", 0, "segment"),
    "sealed stream segment": ("vhosts/*/streams/*/*.seg", 0, "segment"),
    "active stream segment": ("vhosts/*/streams/*/*.seg", -1, "segment"),
}


def unpacked(tmp_path: Path) -> Path:
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(tmp_path, filter="data")
    return tmp_path / "data"


def serve_refused(data_dir: Path) -> str:
    """Run `streamq serve` on `data_dir`: it must exit 1; its stderr."""
    command = streamq("serve", "--data-dir", str(data_dir), "--amqp-port", "0")
    command += ["--http-port", "0", "--stream-port", "-1", "--mqtt-port", "-1"]
    done = subprocess.run(command, capture_output=True, timeout=STARTUP_TIMEOUT_S, check=False)
    stderr = done.stderr.decode(errors="replace")
    assert done.returncode == 1, stderr[-3000:]
    assert "listening" not in stderr
    return stderr


@pytest.mark.parametrize("kind", KINDS)
def test_a_newer_file_stops_the_broker_naming_both_versions(kind: str, tmp_path: Path) -> None:
    pattern, current = KINDS[kind]
    data_dir = unpacked(tmp_path)
    path = sorted(data_dir.glob(pattern))[0]
    data = bytearray(path.read_bytes())
    assert 1 <= struct.unpack_from("<H", data, VERSION_AT)[0] <= current < NEWER, path
    struct.pack_into("<H", data, VERSION_AT, NEWER)
    path.write_bytes(bytes(data))
    stderr = serve_refused(data_dir)
    assert f"{path}: {kind} format version {NEWER} was written by a newer streamq" in stderr
    assert f"reads {kind} format versions up to {current}" in stderr
    assert "Traceback" not in stderr
    assert path.read_bytes() == bytes(data)  # left as the newer streamq wrote it


def test_a_newer_accounts_file_stops_the_broker_naming_both_versions(tmp_path: Path) -> None:
    data_dir = unpacked(tmp_path)
    path = data_dir / "definitions" / "accounts.json"
    accounts = json.loads(path.read_text())
    assert accounts["version"] == 1
    accounts["version"] = NEWER
    path.write_text(json.dumps(accounts))
    before = path.read_bytes()
    stderr = serve_refused(data_dir)
    assert f"(version {NEWER}, this streamq reads up to 2)" in stderr
    assert "Traceback" not in stderr
    assert path.read_bytes() == before


@pytest.mark.parametrize("name", SEGMENT_FILES)
def test_a_newer_segment_or_index_stops_the_broker_naming_both_versions(
    name: str, tmp_path: Path
) -> None:
    """Segments and indexes too, sealed ones included (today's recovery rewrites a header
    it cannot read and rebuilds an index it cannot read: a newer streamq's file must never
    be taken for a damaged one)."""
    pattern, which, kind = SEGMENT_FILES[name]
    data_dir = unpacked(tmp_path)
    found = sorted(data_dir.glob(pattern))
    assert len(found) >= (2 if name != "message log segment" else 1), found
    path = found[which]
    data = bytearray(path.read_bytes())
    assert struct.unpack_from("<H", data, VERSION_AT)[0] == fmt.FORMAT_VERSION
    struct.pack_into("<H", data, VERSION_AT, NEWER)
    struct.pack_into("<I", data, 28, crc32c(bytes(data[:28])))  # as a newer streamq writes it
    path.write_bytes(bytes(data))
    stderr = serve_refused(data_dir)
    assert f"{path}: {kind} format version {NEWER} was written by a newer streamq" in stderr
    assert f"reads {kind} format versions up to {fmt.FORMAT_VERSION_MAX}" in stderr
    assert "Traceback" not in stderr
    assert path.read_bytes() == bytes(data)
