"""A vhost's description, tags and default queue type in the accounts store and its
file: kept across a reopen, dropped with the vhost, absent from files of older streamqs
(which read as none), checked on the way in and out; and the default queue type a new
queue gets (`with_default_queue_type`, RabbitMQ's augment_declare_args)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamq.broker.accounts import (
    AccountsCorrupted,
    AccountStore,
    AccountValueInvalid,
    VHostMetadata,
)
from streamq.broker.queue_arguments import with_default_queue_type

TEAM = VHostMetadata("team a", ("eu", "prod"), "quorum")


def test_metadata_is_kept_across_a_reopen_and_dropped_with_the_vhost(tmp_path: Path) -> None:
    store = AccountStore.open(str(tmp_path))
    store.add_vhost("a", TEAM)
    store.add_vhost("plain")
    reopened = AccountStore.open(str(tmp_path))
    assert reopened.vhost_metadata("a") == TEAM
    assert reopened.vhost_metadata("plain") == VHostMetadata()
    written = json.loads(Path(reopened.path).read_text())
    assert {"name": "plain"} in written["vhosts"]  # nothing written for none
    reopened.set_vhost_metadata("a", VHostMetadata("b", ("x,y",), "quorum"))
    assert reopened.vhost_metadata("a") == VHostMetadata("b", ("x", "y"), "quorum")
    reopened.delete_vhost("a")
    reopened.add_vhost("a")
    assert AccountStore.open(str(tmp_path)).vhost_metadata("a") == VHostMetadata()


def test_a_file_without_metadata_reads_as_none(tmp_path: Path) -> None:
    AccountStore.open(str(tmp_path)).add_vhost("old")
    path = Path(AccountStore.open(str(tmp_path)).path)
    document = json.loads(path.read_text())
    assert all(set(entry) == {"name"} for entry in document["vhosts"])
    assert AccountStore.open(str(tmp_path)).vhost_metadata("old") == VHostMetadata()


def test_bad_metadata_is_refused_and_a_bad_file_is_corrupted(tmp_path: Path) -> None:
    store = AccountStore.open(str(tmp_path))
    with pytest.raises(AccountValueInvalid, match="default_queue_type"):
        store.add_vhost("lazy", VHostMetadata(default_queue_type="lazy"))
    assert not store.has_vhost("lazy")
    store.add_vhost("ok", TEAM)
    path = Path(store.path)
    document = json.loads(path.read_text())
    for entry in document["vhosts"]:
        if entry["name"] == "ok":
            entry["default_queue_type"] = "lazy"
    path.write_text(json.dumps(document))
    with pytest.raises(AccountsCorrupted):
        AccountStore.open(str(tmp_path))


@pytest.mark.parametrize(
    ("default", "durable", "exclusive", "auto_delete", "given", "expected"),
    [
        ("quorum", True, False, False, {}, "quorum"),
        ("stream", True, False, False, {}, "stream"),
        ("quorum", True, True, False, {}, None),  # a quorum queue is never exclusive
        ("quorum", True, False, True, {}, None),
        ("quorum", False, False, False, {}, None),
        ("classic", False, True, True, {}, "classic"),
        ("quorum", True, False, False, {"x-queue-type": "classic"}, "classic"),
        (None, True, False, False, {}, None),
    ],
)
def test_the_default_queue_type_of_a_new_queue(
    default: str | None,
    durable: bool,
    exclusive: bool,
    auto_delete: bool,
    given: dict[str, object],
    expected: str | None,
) -> None:
    arguments = with_default_queue_type(given, default, durable, exclusive, auto_delete)
    assert arguments.get("x-queue-type") == expected
