"""The management API's list parameters on a real broker (sort, filter, page, columns on
every list route, RabbitMQ's answers to bad values), and the connection and account
routes around them: connections by user name, cancelling a consumer, deleting a user
closes its connections, vhost message_stats, `exclusive` on an HTTP queue PUT."""

from __future__ import annotations

import pika
import pika.exceptions
import pytest

from tests.integration.conftest import RunningBroker
from tests.integration.mgmt_http import TIMEOUT_S, call, connect, mgmt_broker, q, wait_for

__all__ = ["mgmt_broker"]


def declare_queues(b: RunningBroker, *names: str) -> None:
    for name in names:
        assert call(b, "PUT", f"/api/queues/%2F/{name}", {})[0] == 201


def test_queues_paged_filtered_sorted_columns(mgmt_broker: RunningBroker) -> None:
    b = mgmt_broker
    declare_queues(b, "orders", "orders.dlq", "payments", "Refunds", "audit")
    plain = call(b, "GET", "/api/queues")[1]
    assert [x["name"] for x in plain] == ["Refunds", "audit", "orders", "orders.dlq", "payments"]
    status, got, _ = call(b, "GET", "/api/queues?page=2&page_size=2&columns=name")
    assert status == 200
    assert got == {
        "total_count": 5,
        "item_count": 2,
        "filtered_count": 5,
        "page": 2,
        "page_size": 2,
        "page_count": 3,
        "items": [{"name": "orders"}, {"name": "orders.dlq"}],
    }
    got = call(b, "GET", "/api/queues/%2F?page=1&name=ORDERS&columns=name,vhost")[1]
    assert got["items"] == [{"name": "orders", "vhost": "/"}, {"name": "orders.dlq", "vhost": "/"}]
    assert got["filtered_count"] == 2 and got["total_count"] == 5
    path = "/api/queues?page=1&name=%5Eo.*s%24&use_regex=true&columns=name"
    assert call(b, "GET", path)[1]["items"] == [{"name": "orders"}]
    got = call(b, "GET", "/api/queues?sort=name&sort_reverse=true&columns=name")[1]
    assert got == [{"name": n} for n in ("payments", "orders.dlq", "orders", "audit", "Refunds")]
    # Without page, name filters nothing (as RabbitMQ).
    assert len(call(b, "GET", "/api/queues?name=orders")[1]) == 5


@pytest.mark.parametrize(
    ("query", "kind", "reason"),
    [
        (
            "page=0",
            "invalid_pagination_parameters",
            "Invalid pagination parameters: page number 0, page size undefined",
        ),
        (
            "page=1&page_size=501",
            "invalid_pagination_parameters",
            "Invalid pagination parameters: page number 1, page size 501",
        ),
        ("page=x", "bad_request", "Pagination parameters are invalid"),
        ("page=3", "page_out_of_range", "Page out of range, page: 3 page size: 100, len: 0"),
    ],
)
def test_bad_paging_is_400(mgmt_broker: RunningBroker, query: str, kind: str, reason: str) -> None:
    for path in ("/api/queues", "/api/exchanges/%2F", "/api/connections", "/api/vhosts"):
        if kind == "page_out_of_range" and path in ("/api/exchanges/%2F", "/api/vhosts"):
            continue  # never empty
        status, got, _ = call(mgmt_broker, "GET", f"{path}?{query}")
        assert (status, got) == (400, {"error": kind, "reason": reason}), path


def test_exchanges_vhosts_users(mgmt_broker: RunningBroker) -> None:
    b = mgmt_broker
    got = call(b, "GET", "/api/exchanges?page=1&page_size=3&name=amq.&sort=name&columns=name")[1]
    assert got["items"] == [{"name": "amq.direct"}, {"name": "amq.fanout"}, {"name": "amq.headers"}]
    assert got["filtered_count"] == got["total_count"] - 1  # not the default exchange
    got = call(b, "GET", "/api/vhosts?page=1&columns=name")[1]
    assert got["items"] == [{"name": "/"}] and got["page_count"] == 1
    # users: sorted and columns, never paged (as RabbitMQ).
    got = call(b, "GET", "/api/users?page=1&sort=name&sort_reverse=true&columns=name")[1]
    assert got == [{"name": n} for n in ("stranger", "readonly", "mon", "mgr", "guest")]
    assert call(b, "GET", "/api/users?page=0")[0] == 200


def test_lists_show_only_what_the_caller_may_see(mgmt_broker: RunningBroker) -> None:
    b = mgmt_broker
    declare_queues(b, "a", "b")
    got = call(b, "GET", "/api/queues?page=1", user="stranger")[1]
    assert got["total_count"] == 0 and got["items"] == []
    assert call(b, "GET", "/api/queues/%2F?page=1", user="stranger")[0] == 403
    assert call(b, "GET", "/api/users?sort=name", user="mgr")[0] == 403


def test_connections_and_channels_paged(mgmt_broker: RunningBroker) -> None:
    b = mgmt_broker
    with connect(b, "mgr") as mine, connect(b, "readonly") as other:
        # streamq lists a channel once a method came on it after channel.open.
        for channel in (mine.channel(), other.channel(), other.channel()):
            channel.basic_qos(prefetch_count=1)
        got = call(b, "GET", "/api/connections?page=1&page_size=1&sort=user&columns=user")[1]
        assert got["items"] == [{"user": "mgr"}] and got["page_count"] == 2
        got = call(b, "GET", "/api/channels?page=1&sort=user&sort_reverse=true&columns=user")[1]
        assert [c["user"] for c in got["items"]] == ["readonly", "readonly", "mgr"]
        # A management user pages through their own only.
        got = call(b, "GET", "/api/channels?page=1", user="mgr")[1]
        assert got["total_count"] == 1
        got = call(b, "GET", "/api/vhosts/%2F/connections?page=1&columns=user&sort=user")[1]
        assert got == [{"user": "mgr"}, {"user": "readonly"}]  # not paged, as RabbitMQ


def test_connections_by_user_name(mgmt_broker: RunningBroker) -> None:
    b = mgmt_broker
    conn = connect(b, "mgr")
    try:
        with connect(b, "readonly"):
            status, got, _ = call(b, "GET", "/api/connections/username/mgr")
            assert status == 200 and [c["user"] for c in got] == ["mgr"]
            assert call(b, "GET", "/api/connections/username/mgr?page=1")[1]["total_count"] == 1
            assert len(call(b, "GET", "/api/connections/username/mgr", user="mgr")[1]) == 1
            assert len(call(b, "GET", "/api/connections/username/mgr", user="mon")[1]) == 1
            assert call(b, "GET", "/api/connections/username/nobody")[1] == []
            # Another management user may not; monitoring may list but not close.
            assert call(b, "GET", "/api/connections/username/mgr", user="readonly")[0] == 403
            assert call(b, "DELETE", "/api/connections/username/mgr", user="mon")[0] == 403
            assert call(b, "GET", "/api/connections/username/mgr?page=0")[0] == 400
            headers = {"X-Reason": "rotating credentials"}
            assert (
                call(b, "DELETE", "/api/connections/username/mgr", user="mgr", headers=headers)[0]
                == 204
            )
            with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as raised:
                conn.process_data_events(time_limit=TIMEOUT_S)
                conn.channel()
            assert raised.value.reply_code == 320
            assert raised.value.reply_text == "CONNECTION_FORCED - rotating credentials"
            wait_for(lambda: call(b, "GET", "/api/connections/username/mgr")[1] == [])
            assert len(call(b, "GET", "/api/connections/username/readonly")[1]) == 1
    finally:
        if conn.is_open:
            conn.close()


def test_cancel_consumer(mgmt_broker: RunningBroker) -> None:
    b = mgmt_broker
    declare_queues(b, "work")
    with connect(b, "mgr") as conn:
        channel = conn.channel()
        cancelled: list[str] = []
        channel.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
        delivered: list[bytes] = []
        tag = channel.basic_consume(
            "work", lambda ch, m, p, body: delivered.append(body), consumer_tag="c1"
        )
        consumer = call(b, "GET", "/api/consumers/%2F")[1][0]
        details = consumer["channel_details"]
        path = f"/api/consumers/%2F/{q(details['connection_name'])}/{details['number']}/{q(tag)}"
        assert call(b, "DELETE", path, user="readonly")[0] == 404  # cannot see it
        assert call(b, "DELETE", path, user="mon")[0] == 403
        assert call(b, "DELETE", path, user="stranger")[0] == 403  # no access to the vhost
        bad = path.replace(f"/{details['number']}/", "/x/")
        assert call(b, "DELETE", bad)[0] == 400
        assert call(b, "DELETE", path.replace("/c1", "/c2"))[0] == 404
        assert call(b, "DELETE", path, user="mgr")[0] == 204
        wait_for(lambda: (conn.process_data_events(time_limit=0.05), cancelled)[1] == ["c1"])
        assert call(b, "GET", "/api/queues/%2F/work")[1]["consumers"] == 0
        assert call(b, "GET", "/api/consumers/%2F")[1] == []
        assert call(b, "DELETE", path)[0] == 404
        # Messages published now stay in the queue; the channel goes on working.
        channel.basic_publish("", "work", b"later")
        conn.process_data_events(time_limit=0.1)
        assert delivered == []
        wait_for(lambda: call(b, "GET", "/api/queues/%2F/work")[1]["messages_ready"] == 1)


def test_deleting_a_user_closes_its_connections(mgmt_broker: RunningBroker) -> None:
    b = mgmt_broker
    conn = connect(b, "mgr")
    others = [connect(b, "readonly"), connect(b)]
    try:
        assert call(b, "DELETE", "/api/users/mgr", user="mgr")[0] == 403
        assert call(b, "DELETE", "/api/users/mgr")[0] == 204
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as raised:
            conn.process_data_events(time_limit=TIMEOUT_S)
            conn.channel()
        assert raised.value.reply_code == 320
        assert raised.value.reply_text == "CONNECTION_FORCED - user 'mgr' is deleted"
        status, got, _ = call(b, "POST", "/api/users/bulk-delete", {"users": ["readonly", "x"]})
        assert (status, got["reason"]) == (400, "no_such_user: x")
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker):
            others[0].process_data_events(time_limit=TIMEOUT_S)
            others[0].channel()
        others[1].channel()  # another user's connection stays open
        wait_for(lambda: [c["user"] for c in call(b, "GET", "/api/connections")[1]] == ["guest"])
    finally:
        for c in [conn, *others]:
            if c.is_open:
                c.close()


def test_vhost_message_stats(mgmt_broker: RunningBroker) -> None:
    b = mgmt_broker
    declare_queues(b, "q")
    with connect(b) as conn:
        channel = conn.channel()
        channel.confirm_delivery()
        for _ in range(3):
            channel.basic_publish("", "q", b"m")
    vhost = call(b, "GET", "/api/vhosts/%2F")[1]
    assert vhost["message_stats"]["publish"] == 3 and "publish_details" in vhost["message_stats"]
    listed = call(b, "GET", "/api/vhosts?columns=name,message_stats.publish")[1]
    assert listed == [{"name": "/", "message_stats": {"publish": 3}}]


def test_exclusive_ignored_on_http_put(mgmt_broker: RunningBroker) -> None:
    """As RabbitMQ 3.10: the queue is declared, not exclusive, and stays."""
    b = mgmt_broker
    assert call(b, "PUT", "/api/queues/%2F/ex", {"exclusive": True, "durable": False})[0] == 201
    queue = call(b, "GET", "/api/queues/%2F/ex")[1]
    assert queue["exclusive"] is False and queue["durable"] is False
    with connect(b) as conn:
        assert conn.channel().queue_declare("ex", passive=True).method.queue == "ex"
