"""A connection's topic permission checks (`access.Permissions.check_topic`): RabbitMQ's
refusal, the answers cached per (kind, exchange, key) within the named bound, and no
per-key work at all for a user without topic permissions in the vhost."""

from __future__ import annotations

from pathlib import Path

import pytest

from amqp_gateway import errors
from amqp_gateway.access import PERMIT_CACHE_ENTRIES_MAX, Permissions
from streamq.broker.accounts import AccountStore


@pytest.fixture
def store(tmp_path: Path) -> AccountStore:
    store = AccountStore.open(str(tmp_path))
    for user in ("plain", "topic"):
        store.add_user(user, "pw")
        store.set_permissions(user, "/", ".*", ".*", ".*")
    store.set_topic_permissions("topic", "/", "amq.topic", "^{username}\\.", "^r$")
    return store


def test_refusal_names_key_exchange_vhost_and_user(store: AccountStore) -> None:
    permissions = Permissions(store, "topic", "/")
    permissions.check_topic("write", "amq.topic", "topic.1", (60, 40))
    permissions.check_topic("read", "amq.topic", "r", (50, 20))
    permissions.check_topic("write", "other", "anything", (60, 40))
    with pytest.raises(errors.AccessRefused) as refused:
        permissions.check_topic("write", "amq.topic", "plain.1", (60, 40))
    assert str(refused.value.reply_text) == (
        "access to topic 'plain.1' in exchange 'amq.topic' in vhost '/' refused for user 'topic'"
    )
    assert (refused.value.class_id, refused.value.method_id) == (60, 40)
    with pytest.raises(errors.AccessRefused, match=r"access to topic 'topic\.1'"):
        permissions.check_topic("read", "amq.topic", "topic.1", (50, 20))


def test_no_topic_permissions_is_one_cached_answer(store: AccountStore) -> None:
    permissions = Permissions(store, "plain", "/")
    for number in range(PERMIT_CACHE_ENTRIES_MAX * 2):
        permissions.check_topic("write", "amq.topic", f"key.{number}", (60, 40))
    assert len(permissions._answers) == 1  # whether there are any: nothing per key


def test_answers_are_cached_within_the_bound(store: AccountStore) -> None:
    permissions = Permissions(store, "topic", "/")
    for number in range(PERMIT_CACHE_ENTRIES_MAX * 2):
        permissions.check_topic("write", "amq.topic", f"topic.{number}", (60, 40))
        assert len(permissions._answers) <= PERMIT_CACHE_ENTRIES_MAX
    permissions.check_topic("write", "amq.topic", "topic.x", (60, 40))
    assert permissions._answers[("topic-write", "amq.topic", "topic.x")] is True


def test_internal_user_is_never_checked(store: AccountStore) -> None:
    permissions = Permissions(store, "topic", "/", allow_all=True)
    permissions.check_topic("write", "amq.topic", "plain.1", (60, 40))
