"""Users, vhosts and permissions from the data directory, enforced on real connections."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest

from streamq.broker.accounts import AccountStore
from tests.integration.conftest import RunningBroker

TIMEOUT_S = 10


@pytest.fixture
def broker_with_users(tmp_path: Path) -> Iterator[RunningBroker]:
    data_dir = tmp_path / "data"
    store = AccountStore.open(str(data_dir))
    store.add_user("bob", "secret")
    store.set_permissions("bob", "/", "^bob-", "^(bob-.*|amq\\.default)$", "^bob-")
    store.add_user("eve", "pw")  # no permissions anywhere
    store.add_vhost("/other")
    store.set_permissions("bob", "/other", ".*", ".*", ".*")
    running = RunningBroker(data_dir)
    yield running
    running.stop()


def connect(
    broker: RunningBroker, user: str, password: str, vhost: str = "/"
) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1",
            broker.amqp_port,
            vhost,
            pika.PlainCredentials(user, password),
            blocked_connection_timeout=TIMEOUT_S,
        )
    )


def test_permissions_allow_and_refuse_with_rabbitmqs_words(
    broker_with_users: RunningBroker,
) -> None:
    with connect(broker_with_users, "bob", "secret") as conn:
        ch = conn.channel()
        ch.queue_declare("bob-jobs")
        ch.basic_publish("", "bob-jobs", b"hi")  # write on the default exchange
        method, _, body = ch.basic_get("bob-jobs", auto_ack=True)
        assert method is not None and body == b"hi"
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            ch.queue_declare("alice-jobs")
        assert refused.value.reply_code == 403
        assert refused.value.reply_text == (
            "ACCESS_REFUSED - access to queue 'alice-jobs' in vhost '/' refused for user 'bob'"
        )
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            ch.queue_bind("bob-jobs", "amq.fanout")  # read on amq.fanout is not granted
        assert refused.value.reply_code == 403
        assert "exchange 'amq.fanout'" in refused.value.reply_text


def test_a_vhost_needs_permissions_and_must_exist(broker_with_users: RunningBroker) -> None:
    with connect(broker_with_users, "bob", "secret", "/other") as conn:
        conn.channel().queue_declare("anything")
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as refused:
        connect(broker_with_users, "eve", "pw")
    assert "(530) \"NOT_ALLOWED - access to vhost '/' refused for user 'eve'\"" in str(
        refused.value
    )
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as missing:
        connect(broker_with_users, "bob", "secret", "/nowhere")
    assert "(530)" in str(missing.value)
    assert "NOT_ALLOWED - vhost /nowhere not found" in str(missing.value)


def test_a_wrong_password_is_refused(broker_with_users: RunningBroker) -> None:
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as refused:
        connect(broker_with_users, "bob", "wrong")
    assert "ACCESS_REFUSED" in str(refused.value)
