"""Shovel and federation upstream values: RabbitMQ's keys, defaults, and the reasons a bad
value is refused."""

from __future__ import annotations

import pytest

from streamq.broker.link_definitions import (
    ParameterInvalid,
    ShovelDefinition,
    UpstreamDefinition,
    UpstreamSetMember,
    check_uri,
    redact_uri,
    shovel_definition,
    upstream_definition,
    upstream_set_definition,
)
from streamq.broker.policies import PolicyInvalid, make_policy

MINIMAL = {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "dest-queue": "b"}


def test_minimal_shovel_has_rabbitmq_defaults() -> None:
    shovel = shovel_definition(MINIMAL)
    assert shovel == ShovelDefinition(
        src_uris=("amqp://",), dest_uris=("amqp://",), src_queue="a", dest_queue="b"
    )
    assert shovel.src_prefetch_count == 1000
    assert shovel.ack_mode == "on-confirm"
    assert shovel.src_delete_after == "never"
    assert shovel.reconnect_delay_s == 1.0
    assert not shovel.dest_is_http


def test_every_key_is_read() -> None:
    shovel = shovel_definition(
        {
            "src-protocol": "amqp091",
            "src-uri": ["amqp://u:p@h1:5672/%2f", "amqps://h2?verify=verify_none"],
            "src-exchange": "x",
            "src-exchange-key": "k.#",
            "src-prefetch-count": 50,
            "src-delete-after": 10,
            "src-consumer-args": {"x-stream-offset": "first"},
            "dest-protocol": "amqp091",
            "dest-uri": "amqp://other:5673",
            "dest-exchange": "y",
            "dest-exchange-key": "rk",
            "dest-add-forward-headers": True,
            "dest-add-timestamp-header": True,
            "dest-publish-properties": {"delivery_mode": 2},
            "ack-mode": "on-publish",
            "reconnect-delay": 2.5,
        }
    )
    assert shovel.src_uris == ("amqp://u:p@h1:5672/%2f", "amqps://h2?verify=verify_none")
    assert (shovel.src_exchange, shovel.src_exchange_key) == ("x", "k.#")
    assert shovel.src_prefetch_count == 50
    assert shovel.src_delete_after == 10
    assert shovel.src_consumer_args == {"x-stream-offset": "first"}
    assert (shovel.dest_exchange, shovel.dest_exchange_key) == ("y", "rk")
    assert shovel.dest_add_forward_headers and shovel.dest_add_timestamp_header
    assert shovel.ack_mode == "on-publish"
    assert shovel.reconnect_delay_s == 2.5


def test_pre_3_7_aliases() -> None:
    shovel = shovel_definition(
        {
            **MINIMAL,
            "prefetch-count": 7,
            "delete-after": "queue-length",
            "add-forward-headers": True,
        }
    )
    assert shovel.src_prefetch_count == 7
    assert shovel.src_delete_after == "queue-length"
    assert shovel.dest_add_forward_headers


def test_http_destination() -> None:
    shovel = shovel_definition({"src-uri": "amqp://", "src-queue": "a", "dest-uri": "https://h/p"})
    assert shovel.dest_is_http


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"bogus": 1}, "Unrecognised terms ['bogus'] in shovel"),
        ({"src-prefetch-count": "10"}, "src-prefetch-count should be a non-negative integer"),
        ({"src-prefetch-count": 70000}, "src-prefetch-count should be at most 65535"),
        ({"ack-mode": "sometimes"}, "ack-mode should be one of on-confirm, on-publish, no-ack"),
        ({"src-delete-after": "later"}, "src-delete-after should be never, queue-length"),
        ({"src-delete-after": -1}, "src-delete-after should be never"),
        ({"src-exchange": "x"}, "Cannot specify 'src-exchange' and 'src-queue' in shovel"),
        ({"dest-exchange": "x"}, "Cannot specify 'dest-exchange' and 'dest-queue' in shovel"),
        ({"src-uri": "ftp://h"}, "scheme must be one of amqp, amqps"),
        ({"src-uri": "amqp://h:99999"}, "is not a valid URI"),
        ({"src-uri": "amqp://h?hearbeat=5"}, "unknown query parameter 'hearbeat'"),
        ({"src-uri": []}, "src-uri should be a URI or a list"),
        ({"src-uri": 5}, "src-uri should be a string"),
        ({"dest-uri": "http://"}, "it has no host"),
        ({"dest-add-forward-headers": "yes"}, "dest-add-forward-headers should be a boolean"),
        ({"src-consumer-args": [1]}, "src-consumer-args should be an object"),
        ({"reconnect-delay": -1}, "reconnect-delay should be a non-negative number"),
        ({"src-protocol": "amqp10"}, "amqp091 only"),
        ({"src-queue": 1}, "src-queue should be a string"),
    ],
)
def test_bad_shovel_values_are_refused_with_the_key(change: dict[str, object], reason: str) -> None:
    with pytest.raises(ParameterInvalid, match=reason.replace("(", r"\(").replace("[", r"\[")):
        shovel_definition({**MINIMAL, **change})


def test_missing_keys() -> None:
    with pytest.raises(ParameterInvalid, match='Key "dest-uri" not found'):
        shovel_definition({"src-uri": "amqp://", "src-queue": "a"})
    with pytest.raises(ParameterInvalid, match="Must specify 'src-exchange' or 'src-queue'"):
        shovel_definition({"src-uri": "amqp://", "dest-uri": "amqp://"})
    with pytest.raises(ParameterInvalid, match="should be a JSON object"):
        shovel_definition(["src-uri"])


def test_passwords_never_show_in_reasons() -> None:
    assert redact_uri("amqp://user:secret@host/vh") == "amqp://user:********@host/vh"
    assert redact_uri("amqp://host") == "amqp://host"
    with pytest.raises(ParameterInvalid) as caught:
        check_uri("src-uri", "amqp://user:secret@host:notaport/", ("amqp",))
    assert "secret" not in str(caught.value)


def test_upstream_defaults_and_keys() -> None:
    assert upstream_definition({"uri": "amqp://up"}) == UpstreamDefinition(uris=("amqp://up",))
    upstream = upstream_definition(
        {
            "uri": ["amqp://a", "amqp://b"],
            "exchange": "x",
            "prefetch-count": 10,
            "reconnect-delay": 1,
            "ack-mode": "no-ack",
            "trust-user-id": True,
            "max-hops": 3,
            "expires": 60000,
            "message-ttl": 1000,
        }
    )
    assert upstream.uris == ("amqp://a", "amqp://b")
    assert upstream.exchange == "x" and upstream.queue is None
    assert (upstream.prefetch_count, upstream.reconnect_delay_s) == (10, 1.0)
    assert upstream.ack_mode == "no-ack" and upstream.trust_user_id
    assert (upstream.max_hops, upstream.expires_ms, upstream.message_ttl_ms) == (3, 60000, 1000)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ({}, 'Key "uri" not found'),
        ({"uri": "amqp://a", "max-hops": -1}, "max-hops should be a non-negative integer"),
        ({"uri": "amqp://a", "trust-user-id": 1}, "trust-user-id should be a boolean"),
        ({"uri": "amqp://a", "exchnage": "x"}, "Unrecognised terms"),
        ({"uri": "http://a"}, "scheme must be one of amqp, amqps"),
    ],
)
def test_bad_upstreams(value: object, reason: str) -> None:
    with pytest.raises(ParameterInvalid, match=reason):
        upstream_definition(value)


def test_upstream_set_members_override_their_upstream() -> None:
    members = upstream_set_definition([{"upstream": "a"}, {"upstream": "b", "max-hops": 2}])
    assert members == (UpstreamSetMember("a"), UpstreamSetMember("b", {"max-hops": 2}))
    base = UpstreamDefinition(uris=("amqp://b",))
    assert members[1].apply(base).max_hops == 2
    assert members[0].apply(base) == base
    with pytest.raises(ParameterInvalid, match='Key "upstream" not found'):
        upstream_set_definition([{"max-hops": 2}])
    with pytest.raises(ParameterInvalid, match="max-hops should be"):
        upstream_set_definition([{"upstream": "a", "max-hops": "2"}])
    with pytest.raises(ParameterInvalid, match="should be a list"):
        upstream_set_definition({"upstream": "a"})


def test_policies_take_the_federation_keys() -> None:
    policy = make_policy(
        "fed", {"pattern": "^fed\\.", "definition": {"federation-upstream-set": "all"}}
    )
    assert policy.definition == {"federation-upstream-set": "all"}
    make_policy("fed", {"pattern": ".", "definition": {"federation-upstream": "up1"}})
    with pytest.raises(PolicyInvalid, match="together"):
        make_policy(
            "fed",
            {
                "pattern": ".",
                "definition": {"federation-upstream": "a", "federation-upstream-set": "all"},
            },
        )
    with pytest.raises(PolicyInvalid, match="must be a string"):
        make_policy("fed", {"pattern": ".", "definition": {"federation-upstream": 1}})
