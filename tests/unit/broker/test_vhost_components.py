"""The vhost as a composition of components (docs/architecture.md, "The vhost's
components"): every call that goes up the import order is wired in when the vhost opens,
the calls the gateways make land on the component that owns them, and what a gateway sets
on the vhost reaches that component.

Method: open a vhost in a temporary directory and look at its wiring, then check the
effect of each wired call through behaviour (a publish over a drop-head limit
dead-letters from the head; a requeue with `deliver` hands the message over at once)."""

from __future__ import annotations

from pathlib import Path

import pytest

from amqp_gateway.codec import BasicProperties, encode_properties
from amqp_gateway.deaths import AmqpPropertiesCodec
from streamq.broker.vhost import VHost
from streamq.log.syncer import Syncer
from tests.unit.broker.consumers import RecordingConsumer

PLAIN = encode_properties(BasicProperties())


@pytest.fixture
def vhost(tmp_path: Path) -> VHost:
    host = VHost("/", str(tmp_path), Syncer())
    host.properties_codec = AmqpPropertiesCodec()
    return host


def test_every_call_up_the_import_order_is_wired_to_its_component(vhost: VHost) -> None:
    wired = {
        "publisher.drain_queue": (vhost.publisher.drain_queue, vhost.delivery),
        "publisher.drop_head": (vhost.publisher.drop_head, vhost.settler),
        "publisher.dead_letter_record": (vhost.publisher.dead_letter_record, vhost.settler),
        "settler.deliver_now": (vhost.settler.deliver_now, vhost.delivery),
        "dead_letters.drain": (vhost.dead_letters.drain, vhost.delivery),
        "entities.expire_head": (vhost.entities.expire_head, vhost.settler),
        "policy_set.drop_dead_letters": (vhost.policy_set.drop_dead_letters, vhost.dead_letters),
    }
    for name, (call, owner) in wired.items():
        assert getattr(call, "__self__", None) is owner, name
    assert vhost.policy_set.queues is vhost.entities.queues
    assert vhost.policy_set.exchanges is vhost.entities.exchanges


def test_the_gateways_calls_are_the_components_bound_methods(vhost: VHost) -> None:
    owners = {
        vhost.publisher: ("publish", "publish_run", "duplicate_free", "delay", "due_delayed"),
        vhost.router: ("route", "route_run", "dead_letter_route"),
        vhost.entities: ("declare_queue", "delete_queue", "bind", "unbind", "declare_exchange"),
        vhost.settler: ("settle", "settle_classic", "requeue_many", "reject", "expire_heads"),
        vhost.delivery: ("drain", "get", "add_consumer", "remove_consumer", "deliver_now"),
        vhost.schedule: ("kick", "fail_queue", "stream_appended", "sync_stream"),
        vhost.policy_set: ("set_policy", "clear_policy", "apply_policies"),
    }
    for owner, names in owners.items():
        for name in names:
            assert getattr(vhost, name).__self__ is owner, name


def test_what_a_gateway_sets_on_the_vhost_reaches_the_component(vhost: VHost) -> None:
    woken: list[int] = []
    vhost.wakeup = lambda: woken.append(1)
    vhost.on_delay = lambda deadline_ms: None
    vhost.default_queue_type = "quorum"
    assert vhost.schedule.wakeup is vhost.wakeup
    assert vhost.publisher.on_delay is vhost.on_delay
    assert vhost.router.properties_codec is vhost.properties_codec is not None
    queue = vhost.declare_queue("q", False, True, False, False, {}, None)
    assert queue.arguments.get("x-queue-type") == "quorum"
    vhost.add_consumer(queue, RecordingConsumer(10))
    vhost.publish("", "q", PLAIN, b"m", [queue])
    assert woken == [1] and vhost.dirty == {queue}  # the schedule's set, as the gateway reads


def test_a_publish_over_a_drop_head_limit_dead_letters_through_the_settler(vhost: VHost) -> None:
    dead = vhost.declare_queue("dead", False, True, False, False, {}, None)
    arguments = {
        "x-max-length": 2,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "dead",
    }
    limited = vhost.declare_queue("limited", False, True, False, False, arguments, None)
    for body in (b"1", b"2", b"3"):
        vhost.publish("", "limited", PLAIN, body, [limited])
    assert limited.cursor.message_count == 2
    assert dead.cursor.message_count == 1
    taken = vhost.get(dead, 0)
    assert taken is not None and taken[1].body == b"1"


def test_a_requeue_with_deliver_hands_the_message_over_at_once(vhost: VHost) -> None:
    queue = vhost.declare_queue("q", False, True, False, False, {}, None)
    first, second = RecordingConsumer(1, "a"), RecordingConsumer(1, "b")
    vhost.add_consumer(queue, first)
    vhost.publish("", "q", PLAIN, b"m", [queue])
    vhost.drain()
    assert first.bodies == [b"m"]
    vhost.add_consumer(queue, second)
    offset = first.unacked.pop()
    vhost.requeue_many([(queue, offset, first)], deliver=True)  # no drain call: at once
    assert first.bodies + second.bodies == [b"m", b"m"]
