"""Topic permissions: RabbitMQ's matching and variable expansion, and their storage in the
account store (set, list, clear, cascade on deletes, the file, old files)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from streamq.broker.accounts import (
    ACCOUNTS_DIR,
    ACCOUNTS_FILE,
    AccountsCorrupted,
    AccountStore,
    AccountValueInvalid,
    UserNotFound,
    VHostNotFound,
)
from streamq.broker.topic_permissions import TopicGrants, TopicPermission, expand

VARIABLES = {"username": "alice", "vhost": "prod"}


def grants(write: str, read: str = ".*", exchange: str = "amq.topic") -> TopicGrants:
    return TopicGrants([TopicPermission("alice", "prod", exchange, write, read)])


# Matching.


def test_exchange_without_topic_permission_allows_every_key() -> None:
    assert grants("^a$").permitted("other", "write", "anything", VARIABLES)


def test_regex_is_searched_not_matched_in_full() -> None:
    assert grants("tenant").permitted("amq.topic", "write", "x.tenant.y", VARIABLES)
    assert not grants("^tenant").permitted("amq.topic", "write", "x.tenant.y", VARIABLES)


def test_write_and_read_are_separate() -> None:
    topic = grants("^w\\.", "^r\\.")
    assert topic.permitted("amq.topic", "write", "w.1", VARIABLES)
    assert not topic.permitted("amq.topic", "write", "r.1", VARIABLES)
    assert topic.permitted("amq.topic", "read", "r.1", VARIABLES)
    assert not topic.permitted("amq.topic", "read", "w.1", VARIABLES)


def test_empty_regex_allows_only_the_empty_key() -> None:
    topic = grants("")
    assert topic.permitted("amq.topic", "write", "", VARIABLES)
    assert not topic.permitted("amq.topic", "write", "a", VARIABLES)


def test_variables_are_expanded_before_matching() -> None:
    topic = grants("^{username}\\.{vhost}\\.")
    assert topic.permitted("amq.topic", "write", "alice.prod.x", VARIABLES)
    assert not topic.permitted("amq.topic", "write", "bob.prod.x", VARIABLES)
    assert not topic.permitted("amq.topic", "write", "alice.prod.x", {"username": "bob"})


def test_a_variable_not_given_stays_literal() -> None:
    """RabbitMQ gives AMQP 0-9-1 connections no client_id: the text stays as it is."""
    assert expand("^{client_id}$", VARIABLES) == "^{client_id}$"
    assert not grants("^{client_id}$").permitted("amq.topic", "write", "c1", VARIABLES)


def test_values_are_not_escaped_and_expand_in_name_order() -> None:
    assert expand("^{username}$", {"username": "a.b"}) == "^a.b$"
    assert grants("^{username}$").permitted("amq.topic", "write", "aXb", {"username": "a.b"})
    # "username" is replaced before "vhost", so a user name holding {vhost} expands again.
    assert expand("{username}", {"username": "{vhost}", "vhost": "v"}) == "v"


def test_a_value_that_breaks_the_regex_refuses() -> None:
    assert not grants("^{username}$").permitted("amq.topic", "write", "(", {"username": "("})


# Storage.


@pytest.fixture
def store(tmp_path: Path) -> AccountStore:
    store = AccountStore.open(str(tmp_path))
    store.add_user("alice", "pw")
    store.add_vhost("prod")
    return store


def reopen(store: AccountStore) -> AccountStore:
    return AccountStore.open(os.path.dirname(os.path.dirname(store.path)))


def test_no_topic_permissions_means_no_grants(store: AccountStore) -> None:
    assert store.topic_grants("alice", "prod") is None
    assert store.list_topic_permissions() == []


def test_set_list_and_persist(store: AccountStore) -> None:
    set_ = store.set_topic_permissions("alice", "prod", "amq.topic", "^a", "^b")
    store.set_topic_permissions("alice", "/", "x", ".*", "")
    assert set_ == TopicPermission("alice", "prod", "amq.topic", "^a", "^b")
    everything = [
        TopicPermission("alice", "/", "x", ".*", ""),
        TopicPermission("alice", "prod", "amq.topic", "^a", "^b"),
    ]
    assert store.list_topic_permissions() == everything
    assert store.list_topic_permissions(vhost="prod") == everything[1:]
    assert store.list_topic_permissions(user="alice", vhost="/") == everything[:1]
    grant = store.topic_grants("alice", "prod")
    assert grant is not None and not grant.permitted("amq.topic", "write", "b", {})
    again = reopen(store)
    assert again.list_topic_permissions() == everything
    assert again.topic_grants("alice", "prod") == grant


def test_set_replaces_the_exchange_entry(store: AccountStore) -> None:
    store.set_topic_permissions("alice", "prod", "amq.topic", "^a", "^b")
    store.set_topic_permissions("alice", "prod", "amq.topic", "^c", "^d")
    assert store.list_topic_permissions() == [
        TopicPermission("alice", "prod", "amq.topic", "^c", "^d")
    ]


def test_set_refuses_bad_regex_and_unknown_names(store: AccountStore) -> None:
    with pytest.raises(AccountValueInvalid, match="invalid write regex"):
        store.set_topic_permissions("alice", "prod", "amq.topic", "([", ".*")
    with pytest.raises(UserNotFound):
        store.set_topic_permissions("bob", "prod", "amq.topic", ".*", ".*")
    with pytest.raises(VHostNotFound):
        store.set_topic_permissions("alice", "nope", "amq.topic", ".*", ".*")
    with pytest.raises(UserNotFound):
        store.list_topic_permissions(user="bob")
    assert store.list_topic_permissions() == []


def test_clear_one_exchange_or_all(store: AccountStore) -> None:
    for exchange in ("a", "b"):
        store.set_topic_permissions("alice", "prod", exchange, ".*", ".*")
    store.set_topic_permissions("alice", "/", "a", ".*", ".*")
    store.clear_topic_permissions("alice", "prod", "a")
    assert [(t.vhost, t.exchange) for t in store.list_topic_permissions()] == [
        ("/", "a"),
        ("prod", "b"),
    ]
    store.clear_topic_permissions("alice", "prod")
    assert [(t.vhost, t.exchange) for t in store.list_topic_permissions()] == [("/", "a")]
    assert store.topic_grants("alice", "prod") is None


def test_clearing_permissions_keeps_topic_permissions(store: AccountStore) -> None:
    store.set_permissions("alice", "prod", ".*", ".*", ".*")
    store.set_topic_permissions("alice", "prod", "amq.topic", ".*", ".*")
    store.clear_permissions("alice", "prod")
    assert len(store.list_topic_permissions()) == 1


def test_deleting_user_or_vhost_drops_its_topic_permissions(store: AccountStore) -> None:
    store.add_user("bob", "pw")
    for user in ("alice", "bob"):
        store.set_topic_permissions(user, "prod", "amq.topic", ".*", ".*")
        store.set_topic_permissions(user, "/", "amq.topic", ".*", ".*")
    store.delete_user("alice")
    assert {(t.user, t.vhost) for t in store.list_topic_permissions()} == {
        ("bob", "prod"),
        ("bob", "/"),
    }
    store.delete_vhost("prod")
    assert [(t.user, t.vhost) for t in reopen(store).list_topic_permissions()] == [("bob", "/")]
    store.delete_users(["bob"])
    assert store.list_topic_permissions() == []


def test_old_file_without_topic_permissions_loads(store: AccountStore) -> None:
    path = Path(store.path)
    document = json.loads(path.read_text())
    assert document["topic_permissions"] == []
    del document["topic_permissions"]
    path.write_text(json.dumps(document))
    assert reopen(store).list_topic_permissions() == []
    assert reopen(store).user("alice") is not None


def test_file_with_topic_permission_of_unknown_user_is_corrupt(tmp_path: Path) -> None:
    store = AccountStore.open(str(tmp_path))
    store.add_vhost("v")
    path = tmp_path / ACCOUNTS_DIR / ACCOUNTS_FILE
    document = json.loads(path.read_text())
    document["topic_permissions"] = [
        {"user": "nobody", "vhost": "v", "exchange": "x", "write": ".*", "read": ".*"}
    ]
    path.write_text(json.dumps(document))
    with pytest.raises(AccountsCorrupted, match="unknown user 'nobody'"):
        AccountStore.open(str(tmp_path))
