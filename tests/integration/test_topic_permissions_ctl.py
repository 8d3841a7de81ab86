"""`streamq ctl`'s topic permission verbs (rabbitmqctl's names and argument order): online
over the management API of a running broker, and offline on a stopped broker's data
directory; what they set is enforced on a real pika connection."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest

from streamq.broker.accounts import AccountStore
from tests.integration.conftest import RunningBroker
from tests.integration.test_ctl import fails, ok
from tests.integration.test_ctl_http import Ctl

TIMEOUT_S = 10
LISTED = (
    'user  exchange   write  read\nbob   amq.topic  ^a\\.   ^b\\.\nbob   x          .*     ""\n'
)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    store = AccountStore.open(str(tmp_path / "data"))
    store.add_user("bob", "pw")
    store.set_permissions("bob", "/", ".*", ".*", ".*")
    store.add_vhost("dev")
    return tmp_path / "data"


@pytest.fixture
def running(data_dir: Path) -> Iterator[RunningBroker]:
    broker = RunningBroker(data_dir)
    yield broker
    broker.stop()


def publish_refused(broker: RunningBroker, routing_key: str) -> bool:
    params = pika.ConnectionParameters(
        "127.0.0.1",
        broker.amqp_port,
        credentials=pika.PlainCredentials("bob", "pw"),
        blocked_connection_timeout=TIMEOUT_S,
    )
    with pika.BlockingConnection(params) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        try:
            ch.basic_publish("amq.topic", routing_key, b"m")
        except pika.exceptions.ChannelClosedByBroker as exc:
            assert exc.reply_code == 403
            return True
    return False


def test_online_verbs(running: RunningBroker, capsys: pytest.CaptureFixture[str]) -> None:
    ctl = Ctl(running, capsys)
    assert ctl.ok("set_topic_permissions", "bob", "amq.topic", "^a\\.", "^b\\.") == (
        'Set the topic permissions of user "bob" on exchange "amq.topic" in vhost "/".\n'
    )
    ctl.ok("set_topic_permissions", "bob", "x", ".*", "")
    ctl.ok("set_topic_permissions", "-p", "dev", "bob", "y", ".*", ".*")
    assert ctl.ok("list_topic_permissions") == LISTED
    assert ctl.json("list_user_topic_permissions", "bob") == [
        {"vhost": "/", "exchange": "amq.topic", "write": "^a\\.", "read": "^b\\."},
        {"vhost": "/", "exchange": "x", "write": ".*", "read": ""},
        {"vhost": "dev", "exchange": "y", "write": ".*", "read": ".*"},
    ]
    assert publish_refused(running, "b.1") and not publish_refused(running, "a.1")
    ctl.ok("clear_topic_permissions", "bob", "x")  # one exchange; the others stay
    assert ctl.json("list_topic_permissions") == [
        {"user": "bob", "exchange": "amq.topic", "write": "^a\\.", "read": "^b\\."}
    ]
    ctl.ok("clear_topic_permissions", "bob")
    assert ctl.ok("list_topic_permissions") == "user  exchange  write  read\n"
    assert not publish_refused(running, "b.1")
    assert len(ctl.json("list_topic_permissions", "-p", "dev")) == 1  # type: ignore[arg-type]
    assert "vhost_or_user_not_found" in ctl.fails(
        "set_topic_permissions", "nobody", "amq.topic", ".*", ".*"
    )
    assert "regex" in ctl.fails("set_topic_permissions", "bob", "amq.topic", "([", ".*")


def test_offline_verbs(data_dir: Path) -> None:
    ok(data_dir, "set_topic_permissions", "bob", "amq.topic", "^a\\.", "^b\\.")
    ok(data_dir, "set_topic_permissions", "bob", "x", ".*", "")
    assert ok(data_dir, "list_topic_permissions") == LISTED
    assert json.loads(ok(data_dir, "list_user_topic_permissions", "bob", "--json")) == [
        {"vhost": "/", "exchange": "amq.topic", "write": "^a\\.", "read": "^b\\."},
        {"vhost": "/", "exchange": "x", "write": ".*", "read": ""},
    ]
    ok(data_dir, "clear_topic_permissions", "bob", "x")
    assert json.loads(ok(data_dir, "list_topic_permissions", "--json")) == [
        {"user": "bob", "exchange": "amq.topic", "write": "^a\\.", "read": "^b\\."}
    ]
    assert "invalid write regex" in fails(data_dir, "set_topic_permissions", "bob", "e", "([", "")
    assert "no user 'nobody'" in fails(data_dir, "list_user_topic_permissions", "nobody")
    broker = RunningBroker(data_dir)  # what ctl wrote offline, the broker enforces
    try:
        assert publish_refused(broker, "b.1") and not publish_refused(broker, "a.1")
    finally:
        broker.stop()
    ok(data_dir, "clear_topic_permissions", "bob")
    assert ok(data_dir, "list_user_topic_permissions", "bob") == "vhost  exchange  write  read\n"
