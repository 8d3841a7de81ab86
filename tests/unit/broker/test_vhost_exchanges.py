"""exchange.declare, delete and bind rules of the vhost as RabbitMQ 3.10 applies them:
the default exchange, amq.* names, if-unused and headers bindings (the differential
scenarios of tests/differential/scenarios/exchange.py compare them with RabbitMQ)."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamq.broker.errors import AccessRefused, PreconditionFailed
from streamq.broker.exchange import Destination
from streamq.broker.vhost import VHost
from streamq.log.syncer import Syncer


@pytest.fixture
def vhost(tmp_path: Path) -> VHost:
    return VHost("/", str(tmp_path), Syncer())


def test_the_default_exchange_cannot_be_bound_to_or_unbound(vhost: VHost) -> None:
    vhost.declare_exchange("x", "direct", False, False, False, False, {})
    refused = "operation not permitted on the default exchange"
    with pytest.raises(AccessRefused, match=refused):
        vhost.bind(Destination("exchange", ""), "x", "k", {})
    with pytest.raises(AccessRefused, match=refused):
        vhost.unbind(Destination("exchange", ""), "x", "k", {})


def test_no_amq_exchange_can_be_deleted_even_a_missing_one(vhost: VHost) -> None:
    for name in ("amq.direct", "amq.nothing"):
        with pytest.raises(AccessRefused) as refused:
            vhost.delete_exchange(name, False)
        assert (
            str(refused.value) == f"deletion of system exchange '{name}' in vhost '/' not allowed"
        )


def test_if_unused_counts_only_bindings_from_the_exchange(vhost: VHost) -> None:
    for name in ("src", "dst"):
        vhost.declare_exchange(name, "fanout", False, False, False, False, {})
    vhost.bind(Destination("exchange", "dst"), "src", "", {})
    with pytest.raises(PreconditionFailed, match="exchange 'src' in vhost '/' in use"):
        vhost.delete_exchange("src", True)
    vhost.delete_exchange("dst", True)
    assert "dst" not in vhost.exchanges and not vhost.exchanges["src"].bindings


def test_a_headers_binding_needs_a_known_x_match(vhost: VHost) -> None:
    vhost.declare_exchange("h", "headers", False, False, False, False, {})
    vhost.declare_queue("q", False, False, False, False, {}, owner=None)
    for mode in ("all", "any", "all-with-x", "any-with-x"):
        vhost.bind(Destination("queue", "q"), "h", "", {"x-match": mode})
    with pytest.raises(PreconditionFailed) as invalid:
        vhost.bind(Destination("queue", "q"), "h", "", {"x-match": "bogus"})
    assert str(invalid.value) == (
        'Invalid x-match field value <<"bogus">>; expected all, any, all-with-x, or any-with-x'
    )
    with pytest.raises(PreconditionFailed) as wrong_type:
        vhost.bind(Destination("queue", "q"), "h", "", {"x-match": 1})
    assert (
        str(wrong_type.value) == "Invalid x-match field type signedint (value 1); expected longstr"
    )
