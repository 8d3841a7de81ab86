"""Queue argument validation on declare: RabbitMQ 3.10's texts and the order in which it
reports the first problem (observed against Debian's rabbitmq-server 3.10.8; the
differential scenarios in tests/differential/scenarios/queue.py compare them live)."""

from __future__ import annotations

import pytest

from amqp_gateway.codec import Int64
from streamq.broker.equivalence import check_arguments
from streamq.broker.errors import PreconditionFailed
from streamq.broker.queue_arguments import check_queue_arguments, check_queue_properties

WHERE = "for queue 'q' in vhost '/'"


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({"x-message-ttl": -1}, "{value_negative,-1}"),
        ({"x-message-ttl": "abc"}, '"expected integer, got longstr"'),
        ({"x-message-ttl": 1.5}, '"expected integer, got double"'),
        ({"x-message-ttl": True}, '"expected integer, got bool"'),
        ({"x-expires": 0}, "{value_zero,0}"),
        ({"x-expires": -5}, "{value_negative,-5}"),
        ({"x-max-length": -1}, "{value_negative,-1}"),
        ({"x-max-priority": 256}, "{max_value_exceeded,256}"),
        ({"x-overflow": "bogus"}, "invalid_overflow"),
        ({"x-overflow": 1}, "{unacceptable_type,signedint}"),
        ({"x-queue-mode": "bogus"}, "\"unsupported queue mode 'bogus'\""),
        ({"x-queue-version": 3}, "\"unsupported queue version '3'\""),
        ({"x-queue-version": "2"}, '"expected integer, got longstr"'),
        ({"x-single-active-consumer": "yes"}, "{unacceptable_type,longstr}"),
        ({"x-dead-letter-routing-key": "k"}, "routing_key_but_no_dlx_defined"),
        ({"x-dead-letter-routing-key": 5}, "{unacceptable_type,signedint}"),
        ({"x-queue-type": "bogus"}, "\"unsupported queue type 'bogus'\""),
        ({"x-queue-type": b"classic"}, "{unacceptable_type,binary}"),
    ],
)
def test_a_bad_value_is_reported_with_rabbitmqs_erlang_term(
    arguments: dict[str, object], problem: str
) -> None:
    [key] = arguments
    with pytest.raises(PreconditionFailed) as raised:
        check_queue_arguments("q", "/", arguments)
    assert str(raised.value) == f"invalid arg '{key}' {WHERE}: {problem}"


def test_the_dead_letter_exchange_type_is_checked_first() -> None:
    with pytest.raises(PreconditionFailed) as raised:
        check_queue_arguments("q", "/", {"x-expires": 0, "x-dead-letter-exchange": 1})
    assert str(raised.value) == (
        "invalid type 'signedint' for arg 'x-dead-letter-exchange' in queue 'q' in vhost '/'"
    )


@pytest.mark.parametrize(
    ("arguments", "reported"),
    [
        ({"x-max-length": -1, "x-message-ttl": -1}, "x-message-ttl"),
        ({"x-overflow": "bogus", "x-queue-type": "bogus"}, "x-queue-type"),
        ({"x-max-priority": 300, "x-expires": 0}, "x-expires"),
        (
            {"x-single-active-consumer": "x", "x-max-in-memory-length": 5},
            "x-single-active-consumer",
        ),
        ({"x-max-in-memory-length": 5, "x-max-age": "1D"}, "x-max-in-memory-length"),
        ({"x-max-age": "1D", "x-max-in-memory-length": 5}, "x-max-age"),
    ],
)
def test_the_first_problem_in_rabbitmqs_order_is_reported(
    arguments: dict[str, object], reported: str
) -> None:
    with pytest.raises(PreconditionFailed, match=f"invalid arg '{reported}'"):
        check_queue_arguments("q", "/", arguments)


def test_arguments_of_another_queue_type_are_refused_by_name() -> None:
    with pytest.raises(PreconditionFailed) as raised:
        check_queue_arguments("q", "/", {"x-max-in-memory-length": -1})
    assert str(raised.value) == (
        f"invalid arg 'x-max-in-memory-length' {WHERE} of queue type rabbit_classic_queue"
    )
    with pytest.raises(PreconditionFailed, match="of queue type rabbit_quorum_queue"):
        check_queue_arguments("q", "/", {"x-queue-type": "quorum", "x-max-priority": 5})


def test_good_values_give_the_queue_type() -> None:
    assert check_queue_arguments("q", "/", {"x-max-priority": 255, "x-expires": 1}) == "classic"
    assert check_queue_arguments("q", "/", {"x-dead-letter-exchange": "", "x-foo": [1]}) == (
        "classic"
    )
    quorum = {"x-queue-type": "quorum", "x-delivery-limit": 3, "x-max-in-memory-length": 0}
    assert check_queue_arguments("q", "/", quorum) == "quorum"
    # A stream's other arguments are checked by streams.py.
    assert check_queue_arguments("q", "/", {"x-queue-type": "stream", "x-max-age": "1D"}) == (
        "stream"
    )
    # streamq's own: delivery limits and consumer timeouts on classic queues.
    assert check_queue_arguments("q", "/", {"x-delivery-limit": 0, "x-consumer-timeout": 5}) == (
        "classic"
    )


def test_a_redeclare_compares_values_as_rabbitmq_compares_erlang_terms() -> None:
    checked = frozenset({"x-dead-letter-exchange", "x-max-length"})
    # A longstr and a binary of the same bytes are equal; integer widths do not matter.
    check_arguments(
        "queue",
        "q",
        "/",
        {"x-dead-letter-exchange": "a"},
        {"x-dead-letter-exchange": b"a"},
        checked,
    )
    check_arguments("queue", "q", "/", {"x-max-length": 10}, {"x-max-length": Int64(10)}, checked)
    # An integer never equals a float.
    with pytest.raises(PreconditionFailed) as raised:
        check_arguments("queue", "q", "/", {"x-max-length": 10}, {"x-max-length": 10.0}, checked)
    assert str(raised.value) == (
        "inequivalent arg 'x-max-length' for queue 'q' in vhost '/': "
        "received '10.0' but current is '10'"
    )


def test_quorum_queues_and_streams_refuse_properties_in_rabbitmqs_order() -> None:
    check_queue_properties("classic", "q", "/", False, True, True)
    for kind in ("quorum", "stream"):
        check_queue_properties(kind, "q", "/", True, False, False)
        for (durable, exclusive, auto_delete), refused in (
            ((False, True, True), "auto-delete"),
            ((False, True, False), "exclusive-owner"),
            ((False, False, False), "non-durable"),
        ):
            with pytest.raises(PreconditionFailed) as raised:
                check_queue_properties(kind, "q", "/", durable, exclusive, auto_delete)
            assert str(raised.value) == f"invalid property '{refused}' {WHERE}"
