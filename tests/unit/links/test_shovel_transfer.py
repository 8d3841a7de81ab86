"""The shovel's bookkeeping from destination confirms to source acks, and the headers it
adds (pure code: no sockets)."""

from __future__ import annotations

import pytest

from amqp_gateway.codec.properties import BasicProperties, decode_properties, encode_properties
from amqp_gateway.codec.values import Timestamp
from streamq.links.shovel_headers import add_headers, forward_record
from streamq.links.shovel_http import request_headers
from streamq.links.shovel_transfer import Transfer


def test_multiple_confirm_acks_the_prefix_once() -> None:
    transfer = Transfer(None)
    assert transfer.take(10, 1) == 10
    transfer.confirm(4, True, True)
    assert transfer.pending_acks() == (4, [])
    assert transfer.pending_acks() == (None, [])  # told once
    transfer.confirm(10, True, True)
    assert transfer.pending_acks() == (10, [])


def test_single_confirms_out_of_order_wait_for_the_gap() -> None:
    transfer = Transfer(None)
    transfer.take(3, 1)
    transfer.confirm(2, False, True)
    transfer.confirm(3, False, True)
    assert transfer.pending_acks() == (None, [])
    transfer.confirm(1, False, True)
    assert transfer.pending_acks() == (3, [])


def test_tags_offset_from_the_first_delivery() -> None:
    transfer = Transfer(None)
    transfer.take(2, 7)  # a channel whose deliveries started at 7
    transfer.confirm(2, True, True)
    assert transfer.pending_acks() == (8, [])
    with pytest.raises(AssertionError, match="skipped"):
        transfer.take(1, 10)


def test_nack_is_requeued_before_the_ack_that_covers_it() -> None:
    transfer = Transfer(None)
    transfer.take(5, 1)
    transfer.confirm(2, False, False)
    transfer.confirm(5, True, True)
    assert transfer.pending_acks() == (5, [2])


def test_delete_after_limits_and_finishes() -> None:
    transfer = Transfer(3)
    assert transfer.take(2, 1) == 2
    assert transfer.take(5, 3) == 1  # the rest stays unacked at the source
    assert not transfer.done
    transfer.confirm(3, True, True)
    assert transfer.done


def test_forward_headers_prepend_a_hop_and_stamp_the_time() -> None:
    earlier = {"shovel-name": "first"}
    raw = encode_properties(BasicProperties(headers={"x-shovelled": [earlier], "k": 1}))
    record = forward_record("second", "/", "streamq@host", {"src-queue": "q"})
    headers = decode_properties(add_headers(raw, record, 1_700_000_000)).headers
    assert headers is not None
    hops = headers["x-shovelled"]
    assert isinstance(hops, list) and [h["shovel-name"] for h in hops] == ["second", "first"]  # type: ignore[index]
    assert headers["x-shovelled-timestamp"] == Timestamp(1_700_000_000)
    assert headers["k"] == 1


def test_http_request_headers_as_lavinmq() -> None:
    raw = encode_properties(
        BasicProperties(content_type="application/json", message_id="m", headers={"uri_path": "/p"})
    )
    headers, path = request_headers("s", raw)
    assert headers["User-Agent"] == "LavinMQ" and headers["X-Shovel"] == "s"
    assert headers["Content-Type"] == "application/json" and headers["X-Message-Id"] == "m"
    assert path == "/p" and headers["X-uri_path"] == "/p"
