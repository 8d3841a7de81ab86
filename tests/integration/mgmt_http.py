"""Helpers for the management API tests of runtime objects: an HTTP call as a given user,
a broker with users of each kind, and pika connections."""

from __future__ import annotations

import http.client
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

import pika
import pytest

from streamq.broker.accounts import AccountStore
from tests.integration.conftest import RunningBroker

TIMEOUT_S = 10
# user: (password, tags, (configure, write, read) on "/" or None)
USERS = {
    "mgr": ("pw", ["management"], (".*", ".*", ".*")),
    "readonly": ("pw", ["management"], ("^$", "^$", ".*")),
    "mon": ("pw", ["monitoring"], None),
    "stranger": ("pw", ["management"], None),
}


def call(
    broker: RunningBroker,
    method: str,
    path: str,
    body: object = None,
    user: str = "guest",
    headers: dict[str, str] | None = None,
) -> tuple[int, object, http.client.HTTPResponse]:
    """One request as `user` (guest or one of USERS); (status, parsed body, response)."""
    password = "guest" if user == "guest" else USERS[user][0]
    return broker.http(method, path, body, user=user, password=password, headers=headers)


def q(name: str) -> str:
    return quote(name, safe="")


@pytest.fixture
def mgmt_broker(tmp_path: Path) -> Iterator[RunningBroker]:
    data_dir = tmp_path / "data"
    store = AccountStore.open(str(data_dir))
    for name, (password, tags, perms) in USERS.items():
        store.add_user(name, password, tags)
        if perms is not None:
            store.set_permissions(name, "/", *perms)
    running = RunningBroker(data_dir)
    yield running
    running.stop()


def connect(broker: RunningBroker, user: str = "guest") -> pika.BlockingConnection:
    password = "guest" if user == "guest" else USERS[user][0]
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1",
            broker.amqp_port,
            credentials=pika.PlainCredentials(user, password),
            blocked_connection_timeout=TIMEOUT_S,
            client_properties={"connection_name": f"test-{user}"},
        )
    )


def wait_for(check: Callable[[], bool], timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)
