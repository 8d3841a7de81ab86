"""Vhost and user limits: RabbitMQ's validation texts (compared with a real RabbitMQ in
tests/differential/scenarios/limits.py), the store's changes and what an older reader of
accounts.json meets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamq.broker import accounts_file
from streamq.broker.account_limits import (
    LimitInvalid,
    check_user_limits,
    check_vhost_limits,
    erlang_text,
    limit_of,
)
from streamq.broker.accounts import AccountsCorrupted, AccountStore, UserNotFound, VHostNotFound


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("abc", '<<"abc">>'),
        ('a"b', '<<"a\\"b">>'),
        ("é", '<<"é"/utf8>>'),
        ("\x01", "<<1>>"),
        ("\ud800", "<<237,160,128>>"),
        (1.5, "1.5"),
        (1e20, "1.0e20"),
        (None, "null"),
        (True, "true"),
        ([1, "x"], '[1,<<"x">>]'),
        ({"b": 1, "a": 2}, '#{<<"a">> => 2,<<"b">> => 1}'),
    ],
)
def test_values_are_quoted_as_erlang_prints_them(value: object, text: str) -> None:
    assert erlang_text(value) == text


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ({"max-foo": 3}, 'Unrecognised terms [{<<"max-foo">>,3}] in limits'),
        ({"max-queues": "abc"}, 'max-queues should be a number, actually was <<"abc">>'),
        ({"max-queues": True}, "max-queues should be a number, actually was true"),
        ({"max-queues": 2**63}, "should be at most"),
        ("x", 'limits not a list <<"x">>'),
    ],
)
def test_vhost_limits_are_validated_in_rabbitmq_s_words(value: object, reason: str) -> None:
    with pytest.raises(LimitInvalid, match=r"^Validation failed\n\n") as caught:
        check_vhost_limits(value)
    assert reason in str(caught.value)


def test_valid_limits_and_the_limit_in_force() -> None:
    assert check_vhost_limits([]) == {}  # RabbitMQ's export of a cleared parameter
    assert check_vhost_limits({"max-queues": -1}) == {"max-queues": -1}
    assert check_user_limits({"max-channels": 0}) == {"max-channels": 0}
    with pytest.raises(
        LimitInvalid, match=r'^max-channels should be a number, actually was <<"5">>$'
    ):
        check_user_limits({"max-channels": "5"})
    assert limit_of({"max-queues": -1}, "max-queues") is None  # negative: no limit
    assert limit_of({"max-queues": 0}, "max-queues") == 0
    assert limit_of(None, "max-queues") is None


def test_the_store_sets_clears_and_keeps_limits(tmp_path: Path) -> None:
    store = AccountStore.open(str(tmp_path))
    store.add_vhost("v")
    store.add_user("u", "pw")
    store.update_vhost_limit("v", "max-connections", 2)
    store.update_vhost_limit("v", "max-queues", 5)
    assert list(store.vhost_limits("v") or {}) == ["max-queues", "max-connections"]  # newest first
    with pytest.raises(LimitInvalid):
        store.update_vhost_limit("v", "max-foo", 1)
    with pytest.raises(VHostNotFound):
        store.update_vhost_limit("w", "max-queues", 1)
    store.set_user_limits("u", {"max-channels": 4})
    store.set_user_limits("u", {"max-connections": 1})
    assert store.user_limits("u") == {"max-channels": 4, "max-connections": 1}
    with pytest.raises(UserNotFound):
        store.set_user_limits("nobody", {"max-channels": 1})
    reopened = AccountStore.open(str(tmp_path))
    assert reopened.vhost_limit("v", "max-queues") == 5
    assert reopened.user_limit("u", "max-connections") == 1
    reopened.clear_vhost_limit("v", "max-queues")
    reopened.clear_vhost_limit("v", "max-connections")
    assert reopened.vhost_limits("v") == {}  # the parameter stays, empty
    reopened.clear_user_limit("u", "all")
    assert reopened.list_user_limits() == []
    reopened.set_vhost_limits("v", None)
    assert json.loads(Path(reopened.path).read_text())["version"] == 1


def test_limits_make_the_file_version_2_and_a_newer_one_is_refused(tmp_path: Path) -> None:
    """A streamq from before limits reads version 1 only (its decode refused any other
    version, tests/upgrade/test_newer_format.py shows the refusal), so a file with limits
    is version 2 rather than a version 1 that it would read without them."""
    store = AccountStore.open(str(tmp_path))
    store.set_vhost_limits("/", {"max-connections": 1})
    document = json.loads(Path(store.path).read_text())
    assert document["version"] == accounts_file.LIMITS_VERSION == 2
    assert document["vhosts"] == [{"name": "/", "limits": {"max-connections": 1}}]
    document["version"] = 3
    Path(store.path).write_text(json.dumps(document))
    with pytest.raises(AccountsCorrupted, match="version 3, this streamq reads up to 2"):
        AccountStore.open(str(tmp_path))


def test_a_version_1_file_with_a_limits_key_ignores_it(tmp_path: Path) -> None:
    """Limits are read from version 2 only: a version-1 file cannot carry them."""
    path = tmp_path / "definitions" / "accounts.json"
    AccountStore.open(str(tmp_path)).add_vhost("v")
    document = json.loads(path.read_text())
    document["vhosts"] = [{**entry, "limits": {"max-queues": 0}} for entry in document["vhosts"]]
    path.write_text(json.dumps(document))
    assert AccountStore.open(str(tmp_path)).list_vhost_limits() == []
