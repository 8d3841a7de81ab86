"""Federation's pure parts: RabbitMQ's names, the `x-received-from` hop and the max-hops
rule, `x-bound-from` on propagated bindings, and thawing a binding's frozen arguments."""

from __future__ import annotations

from amqp_gateway import codec
from streamq.broker.exchange import freeze_arguments
from streamq.links.federation.headers import (
    BOUND_FROM,
    RECEIVED_FROM,
    add_received_from,
    bound_arguments,
    encoded_hop,
    internal_exchange_name,
    received_from_entry,
    should_forward,
    splice_received_from,
    thaw_arguments,
    upstream_queue_name,
    without_credentials,
)


def test_upstream_queue_names_as_rabbitmq() -> None:
    node = "streamq@h"
    assert upstream_queue_name("x", "/", "x", "/", node) == "federation: x -> streamq@h"
    assert upstream_queue_name("up", "/", "x", "/", node) == "federation: up -> streamq@h:x"
    assert upstream_queue_name("x", "v1", "x", "/", node) == "federation: x -> streamq@h:/:x"
    assert internal_exchange_name("federation: x -> n", "B") == "federation: x -> n B"


def test_hops_up_to_max_hops() -> None:
    assert should_forward(None, 1)
    assert should_forward({"other": 1}, 1)
    one_hop = {RECEIVED_FROM: [{"uri": "amqp://a"}]}
    assert not should_forward(one_hop, 1)
    assert should_forward(one_hop, 2)
    assert not should_forward({RECEIVED_FROM: [{}] * 300}, 1000)  # bounded


def test_received_from_is_prepended_and_properties_kept() -> None:
    properties = codec.BasicProperties(
        delivery_mode=2, correlation_id="c", headers={RECEIVED_FROM: [{"uri": "old"}], "k": 1}
    )
    raw = add_received_from(properties, received_from_entry("amqp://b", "exchange", "x", True))
    decoded = codec.decode_properties(raw)
    assert decoded.delivery_mode == 2 and decoded.correlation_id == "c"
    assert decoded.headers is not None and decoded.headers["k"] == 1
    assert decoded.headers[RECEIVED_FROM] == [
        {"uri": "amqp://b", "exchange": "x", "redelivered": True},
        {"uri": "old"},
    ]


def test_bound_from_counts_hops_down() -> None:
    first = bound_arguments({"x-match": "any"}, 2, "/", "x", "A", "n")
    assert first is not None and first["x-match"] == "any"
    (entry,) = first[BOUND_FROM]  # type: ignore[misc]
    assert entry == {"cluster-name": "n", "vhost": "/", "exchange": "/:x A", "hops": 2}
    second = bound_arguments(first, 5, "/", "x", "B", "m")
    assert second is not None
    assert [e["hops"] for e in second[BOUND_FROM]] == [1, 2]  # type: ignore[union-attr, index]
    assert bound_arguments(second, 5, "/", "x", "A", "o") is None  # no hops left


def test_thaw_undoes_freeze() -> None:
    arguments = {"a": 1, "t": {"k": "v", "n": {"m": 2}}, "l": [1, "two"], "s": "x"}
    assert thaw_arguments(freeze_arguments(arguments)) == arguments


def test_uri_without_credentials() -> None:
    assert without_credentials("amqp://u:p@h:5672/%2F") == "amqp://h:5672/%2F"
    assert without_credentials("amqps://h") == "amqps://h"


def test_spliced_hop_equals_the_decoded_way() -> None:
    """The fast path (no headers, no user-id) gives the bytes of decode, add, encode."""
    entry = received_from_entry("amqp://h", "exchange", "x", False)
    table = encoded_hop(entry)
    for properties in (
        codec.BasicProperties(),
        codec.BasicProperties(content_type="text/plain", delivery_mode=2),
        codec.BasicProperties(content_type="a", content_encoding="gzip", message_id="m"),
    ):
        raw = codec.encode_properties(properties)
        assert splice_received_from(raw, table) == add_received_from(properties, entry)
    with_headers = codec.encode_properties(codec.BasicProperties(headers={"k": 1}))
    with_user = codec.encode_properties(codec.BasicProperties(user_id="u"))
    assert splice_received_from(with_headers, table) is None
    assert splice_received_from(with_user, table) is None
    assert splice_received_from(b"\x80", table) is None
    assert splice_received_from(b"\xc0\x00\x05ab", table) is None  # truncated
