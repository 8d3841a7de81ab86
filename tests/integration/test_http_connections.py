"""`/api/connections`, `/api/channels` and `/api/consumers` on a real broker: pika
connections are listed with RabbitMQ's fields, visible to their own user and to
monitoring, and closed over HTTP with 320 CONNECTION_FORCED and the X-Reason text."""

from __future__ import annotations

import pika
import pytest

from tests.integration.conftest import RunningBroker
from tests.integration.mgmt_http import call, connect, mgmt_broker, q, wait_for

__all__ = ["mgmt_broker"]


def test_list_get_channels_and_consumers(mgmt_broker: RunningBroker) -> None:
    b = mgmt_broker
    with connect(b, "mgr") as conn:
        channel = conn.channel()
        channel.basic_qos(prefetch_count=7)
        channel.confirm_delivery()
        channel.queue_declare("cq")
        channel.basic_consume("cq", lambda *args: None, consumer_tag="tag1")
        conn.process_data_events(time_limit=0.05)
        status, listed, _ = call(b, "GET", "/api/connections")
        assert status == 200 and len(listed) == 1
        found = listed[0]
        name = found["name"]
        assert name.endswith(f" -> 127.0.0.1:{b.amqp_port}") and name.startswith("127.0.0.1:")
        assert found["user"] == "mgr" and found["vhost"] == "/" and found["channels"] == 1
        assert found["client_properties"]["connection_name"] == "test-mgr"
        assert found["protocol"] == "AMQP 0-9-1" and found["state"] == "running"
        assert found["recv_oct"] > 0 and found["send_oct"] > 0
        assert found["auth_mechanism"] == "PLAIN" and found["ssl"] is False
        assert found["ssl_protocol"] is None and found["peer_cert_subject"] is None
        assert call(b, "GET", f"/api/connections/{q(name)}")[1]["name"] == name
        assert call(b, "GET", "/api/vhosts/%2F/connections")[1][0]["name"] == name
        channels = call(b, "GET", f"/api/connections/{q(name)}/channels")[1]
        assert len(channels) == 1
        info = channels[0]
        assert info["name"] == f"{name} (1)" and info["number"] == 1
        assert info["confirm"] is True and info["prefetch_count"] == 7
        assert info["consumer_count"] == 1 and info["connection_details"]["name"] == name
        assert call(b, "GET", "/api/channels")[1][0]["name"] == info["name"]
        assert call(b, "GET", "/api/vhosts/%2F/channels")[1][0]["name"] == info["name"]
        assert call(b, "GET", f"/api/channels/{q(info['name'])}")[1]["number"] == 1
        consumers = call(b, "GET", "/api/consumers")[1]
        assert [(c["consumer_tag"], c["queue"]["name"]) for c in consumers] == [("tag1", "cq")]
        assert call(b, "GET", "/api/consumers/%2F")[1] == consumers
        # Visibility: the owner and monitoring see it; another management user does not.
        assert len(call(b, "GET", "/api/connections", user="mon")[1]) == 1
        assert len(call(b, "GET", "/api/consumers", user="mgr")[1]) == 1
        assert call(b, "GET", "/api/connections", user="readonly")[1] == []
        assert call(b, "GET", "/api/channels", user="readonly")[1] == []
        assert call(b, "GET", f"/api/connections/{q(name)}", user="readonly")[0] == 404
    wait_for(lambda: call(b, "GET", "/api/connections")[1] == [])


def test_missing_objects(mgmt_broker: RunningBroker) -> None:
    b = mgmt_broker
    assert call(b, "GET", "/api/connections/nope")[0] == 404
    assert call(b, "DELETE", "/api/connections/nope")[0] == 404
    assert call(b, "GET", "/api/connections/nope/channels")[0] == 404
    assert call(b, "GET", "/api/channels/nope")[0] == 404
    assert call(b, "GET", "/api/vhosts/nowhere/connections")[0] == 404
    assert call(b, "GET", "/api/consumers/nowhere")[0] == 404
    assert call(b, "GET", "/api/vhosts/%2F/channels", user="stranger")[0] == 403


@pytest.mark.parametrize("reason", [None, "maintenance"])
def test_close_with_connection_forced(mgmt_broker: RunningBroker, reason: str | None) -> None:
    b = mgmt_broker
    conn = connect(b, "mgr")
    try:
        name = call(b, "GET", "/api/connections")[1][0]["name"]
        # Another management user may not close it; monitoring may see but not close it.
        assert call(b, "DELETE", f"/api/connections/{q(name)}", user="readonly")[0] == 404
        assert call(b, "DELETE", f"/api/connections/{q(name)}", user="mon")[0] == 403
        headers = {"X-Reason": reason} if reason else {}
        assert call(b, "DELETE", f"/api/connections/{q(name)}", headers=headers)[0] == 204
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as raised:
            conn.process_data_events(time_limit=5)
            conn.channel()
        text = reason or "Closed via management plugin"
        assert raised.value.reply_code == 320
        assert raised.value.reply_text == f"CONNECTION_FORCED - {text}"
    finally:
        if conn.is_open:
            conn.close()
    wait_for(lambda: call(b, "GET", "/api/connections")[1] == [])


def test_own_connection_closed_by_its_user(mgmt_broker: RunningBroker) -> None:
    b = mgmt_broker
    conn = connect(b, "mgr")
    name = call(b, "GET", "/api/connections", user="mgr")[1][0]["name"]
    assert call(b, "DELETE", f"/api/connections/{q(name)}", user="mgr")[0] == 204
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker):
        conn.process_data_events(time_limit=5)
        conn.channel()


def test_a_channel_is_listed_as_soon_as_it_is_open(mgmt_broker: RunningBroker) -> None:
    b = mgmt_broker
    with connect(b, "mgr") as conn:
        conn.channel()  # channel.open and nothing else, as RabbitMQ lists it
        conn.channel()
        listed = call(b, "GET", "/api/channels")[1]
        assert sorted(c["number"] for c in listed) == [1, 2]
        assert call(b, "GET", "/api/connections")[1][0]["channels"] == 2


def test_the_server_properties_name_the_node_as_the_api_does(mgmt_broker: RunningBroker) -> None:
    b = mgmt_broker
    with connect(b) as conn:
        properties = conn._impl.server_properties
        assert properties["node"] == call(b, "GET", "/api/overview")[1]["node"]
        assert properties["node"].startswith("streamq@")
        assert properties["product"] == "streamq"
