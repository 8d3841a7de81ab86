"""The checksum cache of full syncs (streamq/cluster/checksums.py), on real files: an
unchanged file is not read again, across processes too (the cache file); every kind of
change is seen (append, a rewrite of the same size, a replace); a file hashed while it
was just written is hashed again; a damaged cache file, or one a full disk kept from
being saved, only costs hashing; and the cache never crosses to a follower (a local
file, left out of listings)."""

from __future__ import annotations

import hashlib
import logging
import os
import time
from pathlib import Path

import pytest

from streamq.cluster.checksums import CACHE_FILE, RACY_NS, ChecksumCache, cache_for
from streamq.cluster.sync import list_tree, plan_sync
from tests.small_fs import fill, small_filesystem

SETTLED_S = RACY_NS / 1e9 + 1  # an mtime this far back is past the racy window


def aged(path: Path) -> None:
    """Sets the file's mtime back past the racy window (as a file written a while ago)."""
    then = time.time() - SETTLED_S
    os.utime(path, (then, then))


def sha1(data: bytes) -> bytes:
    return hashlib.sha1(data).digest()


def test_an_unchanged_file_is_hashed_once_even_by_another_process(tmp_path: Path) -> None:
    (tmp_path / "seg").write_bytes(b"x" * 5000)
    aged(tmp_path / "seg")
    cache = ChecksumCache(str(tmp_path))
    assert cache.sha1("seg") == (5000, sha1(b"x" * 5000))
    assert cache.sha1("seg") == (5000, sha1(b"x" * 5000))
    assert (cache.hashed, cache.reused) == (1, 1)
    cache.save()
    again = ChecksumCache(str(tmp_path))  # as after a restart: from the cache file
    assert again.sha1("seg") == (5000, sha1(b"x" * 5000))
    assert (again.hashed, again.reused) == (0, 1)


def test_every_change_is_seen(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"a" * 100)
    aged(path)
    cache = ChecksumCache(str(tmp_path))
    cache.sha1("f")
    with path.open("ab") as out:  # an append: the size moves
        out.write(b"b")
    assert cache.sha1("f") == (101, sha1(b"a" * 100 + b"b"))
    aged(path)
    cache.sha1("f")
    stat = path.stat()
    with path.open("r+b") as out:  # the same size, and mtime put back: ctime moves
        out.write(b"z")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert cache.sha1("f") == (101, sha1(b"z" + b"a" * 99 + b"b"))
    replacement = tmp_path / "f.new"  # a replace: another inode
    replacement.write_bytes(b"c" * 101)
    os.utime(replacement, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    os.replace(replacement, path)
    assert cache.sha1("f") == (101, sha1(b"c" * 101))


def test_a_file_hashed_right_after_a_write_is_hashed_again(tmp_path: Path) -> None:
    (tmp_path / "fresh").write_bytes(b"new")
    cache = ChecksumCache(str(tmp_path))
    cache.sha1("fresh")
    cache.sha1("fresh")
    assert (cache.hashed, cache.reused) == (2, 0)


def test_a_damaged_cache_file_only_costs_hashing(tmp_path: Path) -> None:
    (tmp_path / "seg").write_bytes(b"data")
    aged(tmp_path / "seg")
    stat = (tmp_path / "seg").stat()
    lines = [
        "not a line\n",
        f"{'00' * 20} {stat.st_size} {stat.st_mtime_ns} {stat.st_ctime_ns} zz seg\n",
        f"{'ab' * 19} 4 1 1 1 seg\n",
    ]
    (tmp_path / CACHE_FILE).write_text("".join(lines))
    cache = ChecksumCache(str(tmp_path))
    assert cache.sha1("seg") == (4, sha1(b"data"))
    assert cache.hashed == 1


def test_listings_use_the_cache_and_never_list_it(tmp_path: Path) -> None:
    leader, follower = tmp_path / "leader", tmp_path / "follower"
    for root in (leader, follower):
        (root / "vhost").mkdir(parents=True)
        (root / "vhost" / "seg1").write_bytes(b"s" * 70000)
        aged(root / "vhost" / "seg1")
    (leader / "vhost" / "seg2").write_bytes(b"t" * 10)
    first = list_tree(str(leader))
    assert (leader / CACHE_FILE).exists()
    assert [e.path for e in first] == ["vhost", "vhost/seg1", "vhost/seg2"]
    second = list_tree(str(leader))
    assert second == first
    cache = cache_for(str(leader))
    assert (cache.hashed, cache.reused) == (3, 1)  # seg2, just written, was hashed again
    plan = plan_sync(str(follower), second)
    assert [e.path for e in plan.request] == ["vhost/seg2"]
    assert (follower / CACHE_FILE).exists()
    again = plan_sync(str(follower), second)  # the follower's seg1 from its cache now
    assert [e.path for e in again.request] == ["vhost/seg2"]


def test_a_full_disk_keeps_the_old_cache_file_and_costs_only_hashing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with small_filesystem(tmp_path / "small", "1m") as root:
        (root / "seg0").write_bytes(b"0" * 1000)
        aged(root / "seg0")
        cache = ChecksumCache(str(root))
        cache.sha1("seg0")
        cache.save()
        saved = (root / CACHE_FILE).read_bytes()
        for n in range(1, 40):
            (root / f"seg{n}").write_bytes(bytes([n]) * 1000)
            aged(root / f"seg{n}")
            cache.sha1(f"seg{n}")
        filler = fill(root / "filler", 0)
        with caplog.at_level(logging.WARNING):
            cache.save()  # no room: logged, nothing raised
        assert "cannot save the checksum cache" in caplog.text
        assert (root / CACHE_FILE).read_bytes() == saved
        assert not (root / (CACHE_FILE + ".tmp")).exists()
        again = ChecksumCache(str(root))  # from the old file: right, only slower
        assert again.sha1("seg7") == (1000, sha1(bytes([7]) * 1000))
        assert (again.hashed, again.reused) == (1, 0)
        filler.unlink()
        cache.save()
        assert len((root / CACHE_FILE).read_text().splitlines()) == 40
