"""The checker against histories whose violations are known: a clean one passes, and each
rule catches the history that breaks it (and only that rule fires). A checker that
misses a violation would make every fault run look clean."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.faults.checker import Verdict, check
from tests.faults.history import (
    Ack,
    Delivery,
    Event,
    Outcome,
    Publish,
    Remaining,
    Tenure,
    read_history,
    write_history,
)

Q, S = "work", "events"
OUTCOMES: list[Outcome] = ["confirmed", "confirmed", "refused"]


def clean() -> list[Event]:
    """Two nodes: n1 leads until 10.0 (lease and writes), n2 from 10.5. A queue whose
    messages q0..q5 are all acked except q5, still queued (q2 redelivered, flagged, after
    n1 went away); a stream with s0..s3 from publisher p (s3's outcome unknown, stored all
    the same), read by one consumer; a refused publish that is nowhere."""
    events: list[Event] = [
        Tenure("n1", "lease", 0.0, 10.0),
        Tenure("n1", "writes", 0.1, 9.9),
        Tenure("n2", "lease", 10.5, None),
        Tenure("n2", "writes", 10.6, None),
    ]
    for n in range(6):
        node, sent = ("n1", 1.0 + n) if n < 3 else ("n2", 11.0 + n)
        events.append(Publish(Q, f"q{n}", "pq", n, node, sent, "confirmed", sent + 0.01))
    events.append(Publish(Q, "qx", "pq", 6, "n2", 20.0, "refused", 20.01))
    for n in range(5):
        node, at = ("n1", 2.0 + n) if n < 3 else ("n2", 12.0 + n)
        events += [Delivery(Q, f"q{n}", "c1", node, at), Ack(Q, f"q{n}", "c1", at + 0.01)]
    events.append(Delivery(Q, "q2", "c2", "n2", 11.5, redelivered=True))
    for n in range(4):
        outcome: Outcome = "unknown" if n == 3 else "confirmed"
        answered = None if n == 3 else 3.01 + n
        events.append(Publish(S, f"s{n}", "p", n, "n1", 3.0 + n, outcome, answered))
        events.append(Delivery(S, f"s{n}", "r", "n2", 12.0 + n, offset=100 + n))
    events += [
        Remaining(Q, "queue", ("q5",)),
        Remaining(S, "stream", ("s0", "s1", "s2", "s3"), (100, 101, 102, 103)),
    ]
    return events


def only(verdict: Verdict, rule: str) -> None:
    assert set(verdict.counts) == {rule}, verdict.report()


def replaced(events: list[Event], old: Event, new: Event | None) -> list[Event]:
    index = events.index(old)
    return events[:index] + ([] if new is None else [new]) + events[index + 1 :]


def test_a_clean_history_passes() -> None:
    verdict = check(clean())
    assert verdict.ok, verdict.report()
    assert (verdict.publishes, verdict.confirmed, verdict.deliveries, verdict.acks) == (
        11,
        9,
        10,
        5,
    )
    assert verdict.repeats == 1


def test_a_confirmed_queue_message_neither_acked_nor_held_is_lost() -> None:
    events = [e for e in clean() if e != Remaining(Q, "queue", ("q5",))]
    only(check([*events, Remaining(Q, "queue", ())]), "lost")


def test_a_delivered_but_unacked_queue_message_gone_after_heal_is_lost() -> None:
    events = replaced(clean(), Ack(Q, "q1", "c1", 3.01), None)
    verdict = check(events)
    only(verdict, "lost")
    assert verdict.examples["lost"] == ["q1 in work"]


def test_a_confirmed_stream_message_missing_and_never_read_is_lost() -> None:
    events = replaced(clean(), Delivery(S, "s1", "r", "n2", 13.0, offset=101), None)
    events = replaced(
        events,
        Remaining(S, "stream", ("s0", "s1", "s2", "s3"), (100, 101, 102, 103)),
        Remaining(S, "stream", ("s0", "s2", "s3"), (100, 102, 103)),
    )
    only(check(events), "lost")


def test_a_message_never_published_is_unexpected() -> None:
    events = [*clean(), Delivery(Q, "ghost", "c1", "n2", 30.0)]
    events = replaced(events, Remaining(Q, "queue", ("q5",)), Remaining(Q, "queue", ("q5", "q9")))
    verdict = check(events)
    only(verdict, "unexpected")
    assert verdict.counts["unexpected"] == 2


def test_a_message_published_to_another_target_is_unexpected_here() -> None:
    only(check([*clean(), Delivery("other", "q0", "c1", "n2", 30.0)]), "unexpected")


def test_a_repeat_delivery_without_the_redelivered_flag_is_caught() -> None:
    events = replaced(
        clean(),
        Delivery(Q, "q2", "c2", "n2", 11.5, redelivered=True),
        Delivery(Q, "q2", "c2", "n2", 11.5, redelivered=False),
    )
    only(check(events), "unflagged")


def test_two_deliveries_without_the_flag_are_caught_whatever_their_connections() -> None:
    events = replaced(
        clean(),
        Delivery(Q, "q2", "c2", "n2", 11.5, redelivered=True),
        Delivery(Q, "q2", "c2", "n2", 11.5, session=1),
    )
    events = replaced(
        events, Delivery(Q, "q2", "c1", "n1", 4.0), Delivery(Q, "q2", "c1", "n1", 4.0, session=1)
    )
    only(check(events), "unflagged")


def p1_652(c0_next_session: int) -> list[Event]:
    """The fault run that found the stale delivery (times less 1796498000): p1-652 went
    to c0 through a follower (n0) whose link then went down; the leader gave that
    connection up, requeued p1-652 and delivered it, flagged, to c1, which acked it; when
    n0's link came back the first delivery reached c0 after all, unflagged, and c0's
    connection ended. c0's next delivery, of p1-707, on connection `c0_next_session`."""
    events: list[Event] = [Tenure("t9", "lease", 780.9, None), Tenure("t9", "writes", 782.9)]
    for n, sent, outcome in ((651, 784.508, "confirmed"), (652, 784.63, "unknown")):
        answered = 784.63 if outcome == "confirmed" else None
        events.append(Publish(Q, f"p1-{n}", "p1", n, "t9", sent, outcome, answered))
    events += [
        Publish(Q, "p1-653", "p1", 653, "t9", 789.995, "confirmed", 790.003),
        Publish(Q, "p1-707", "p1", 707, "t9", 791.707, "confirmed", 791.724),
        Delivery(Q, "p1-651", "c0", "t9", 784.512, session=3),
        Delivery(Q, "p1-652", "c1", "t9", 789.18, redelivered=True, session=1),
        Delivery(Q, "p1-653", "c1", "t9", 789.999, session=1),
        Delivery(Q, "p1-652", "c0", "t9", 791.505, session=3),
        Delivery(Q, "p1-707", "c0", "t9", 791.711, session=c0_next_session),
        Remaining(Q, "queue", ()),
    ]
    events += [Ack(Q, e.message, e.consumer, e.at) for e in events if isinstance(e, Delivery)]
    return events


def test_a_first_delivery_received_after_its_redelivery_on_a_dead_connection_passes() -> None:
    verdict = check(p1_652(c0_next_session=4))
    assert verdict.ok, verdict.report()
    assert verdict.repeats == 1


def test_a_late_unflagged_delivery_on_a_connection_still_served_is_caught() -> None:
    """c0's connection got p1-707, published after p1-652's redelivery: the broker still
    served it then, so p1-652 came on it after the requeue, without the flag."""
    verdict = check(p1_652(c0_next_session=3))
    only(verdict, "unflagged")
    assert "p1-652 in work to c0 after a delivery" in verdict.examples["unflagged"][0]


def test_a_late_unflagged_delivery_on_the_connection_of_its_redelivery_is_caught() -> None:
    """c0 got p1-652 flagged, then again unflagged, on one connection: no first delivery
    held up, since the broker gives a connection up before it redelivers what it held."""
    events = replaced(
        p1_652(c0_next_session=4),
        Delivery(Q, "p1-652", "c1", "t9", 789.18, redelivered=True, session=1),
        Delivery(Q, "p1-652", "c0", "t9", 789.18, redelivered=True, session=3),
    )
    only(check(events), "unflagged")


def test_a_late_unflagged_delivery_without_its_connection_recorded_is_caught() -> None:
    events = [
        dataclasses.replace(e, session=None) if isinstance(e, Delivery) else e
        for e in p1_652(c0_next_session=4)
    ]
    only(check(events), "unflagged")


def test_repeats_past_the_bound_are_caught_even_when_flagged() -> None:
    events = clean() + [Delivery(Q, "q0", "c2", "n2", 20.0 + n, redelivered=True) for n in range(5)]
    assert check(events, duplicates_max=6).ok
    only(check(events, duplicates_max=5), "duplicates")


def test_an_acked_message_back_after_heal_counts_as_a_repeat() -> None:
    events = replaced(clean(), Remaining(Q, "queue", ("q5",)), Remaining(Q, "queue", ("q5", "q0")))
    assert check(events).repeats == 2
    only(check(events, duplicates_max=1), "duplicates")


def test_a_stream_holding_a_message_twice_is_caught() -> None:
    events = replaced(
        clean(),
        Remaining(S, "stream", ("s0", "s1", "s2", "s3"), (100, 101, 102, 103)),
        Remaining(S, "stream", ("s0", "s1", "s2", "s3", "s1"), (100, 101, 102, 103, 104)),
    )
    only(check(events), "stored_twice")


def test_a_read_of_an_offset_that_now_holds_another_message_is_caught() -> None:
    events = replaced(
        clean(),
        Delivery(S, "s2", "r", "n2", 14.0, offset=102),
        Delivery(S, "s2", "r", "n2", 14.0, offset=101),
    )
    only(check(events), "offset_mismatch")


def test_a_publisher_s_messages_out_of_order_in_a_stream_are_caught() -> None:
    events = replaced(
        clean(),
        Remaining(S, "stream", ("s0", "s1", "s2", "s3"), (100, 101, 102, 103)),
        Remaining(S, "stream", ("s0", "s2", "s1", "s3"), (100, 101, 102, 103)),
    )
    events = [e for e in events if not (isinstance(e, Delivery) and e.target == S)]
    only(check(events), "order")


def test_a_confirm_from_a_node_without_a_lease_is_caught() -> None:
    late = Publish(Q, "q9", "pq", 9, "n1", 10.2, "confirmed", 10.3)  # n1's lease ended at 10.0
    events = [*clean(), late]
    events = replaced(events, Remaining(Q, "queue", ("q5",)), Remaining(Q, "queue", ("q5", "q9")))
    verdict = check(events)
    only(verdict, "unfenced")
    assert "n1 confirmed q9" in verdict.examples["unfenced"][0]


def test_a_confirm_sent_while_the_lease_held_and_received_after_passes() -> None:
    edge = Publish(Q, "q9", "pq", 9, "n1", 9.95, "confirmed", 10.2)
    events = [*clean(), edge]
    events = replaced(events, Remaining(Q, "queue", ("q5",)), Remaining(Q, "queue", ("q5", "q9")))
    assert check(events).ok


def test_two_nodes_accepting_writes_at_once_are_caught() -> None:
    events = replaced(clean(), Tenure("n2", "writes", 10.6, None), Tenure("n2", "writes", 9.5))
    only(check(events), "two_writers")


def test_a_long_writes_tenure_is_seen_past_shorter_ones_that_start_later() -> None:
    """n1 writes 0-100; n1 again 5-6; n2 at 50: overlaps the first, not the second."""
    events: list[Event] = [
        Tenure("n1", "writes", 0.0, 100.0),
        Tenure("n1", "writes", 5.0, 6.0),
        Tenure("n2", "writes", 50.0, 60.0),
    ]
    only(check(events), "two_writers")


def test_the_history_survives_its_file(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    write_history(path, p1_652(4) + clean())
    assert list(read_history(path)) == p1_652(4) + clean()


def test_a_damaged_history_line_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    path.write_text('{"event": "publish", "target": "q"}\n')
    with pytest.raises(ValueError, match="not a publish event"):
        list(read_history(path))


# -- random histories: a correct broker's, then one known fault --------------------------


def simulated(data: st.DataObject) -> list[Event]:
    """A history a correct single-queue broker could produce: some publishes confirmed,
    some refused; each confirmed message acked once (maybe after flagged redeliveries)
    or still queued."""
    events: list[Event] = [Tenure("n1", "lease", 0.0, None), Tenure("n1", "writes", 0.0, None)]
    count = data.draw(st.integers(1, 40))
    for n in range(count):
        outcome: Outcome = data.draw(st.sampled_from(OUTCOMES))
        events.append(Publish(Q, f"m{n}", "p", n, "n1", float(n), outcome, n + 0.5))
    left = []
    for n, event in enumerate(list(events[2:])):
        assert isinstance(event, Publish)
        if event.outcome != "confirmed":
            continue
        if data.draw(st.booleans()):
            left.append(event.message)
            continue
        for again in range(data.draw(st.integers(1, 3))):
            events.append(Delivery(Q, event.message, "c", "n1", 100.0 + n + again / 10, again > 0))
        events.append(Ack(Q, event.message, "c", 101.0 + n))
    events.append(Remaining(Q, "queue", tuple(left)))
    return events


FAULTS: list[tuple[str, Callable[[list[Event]], list[Event]]]] = [
    ("unexpected", lambda e: [*e, Delivery(Q, "never", "c", "n1", 999.0)]),
    ("unfenced", lambda e: [*e, Publish(Q, "m-late", "p", 99, "n2", 5.0, "confirmed", 5.1)]),
    ("two_writers", lambda e: [*e, Tenure("n2", "writes", 50.0, 51.0)]),
]


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_random_correct_histories_pass_and_each_injected_fault_is_caught(
    data: st.DataObject,
) -> None:
    events = simulated(data)
    assert check(events).ok, check(events).report()
    rule, fault = data.draw(st.sampled_from(FAULTS))
    assert rule in check(fault(events)).counts
    acked = [e for e in events if isinstance(e, Ack)]
    if acked:  # drop an ack: the message was delivered, never acked and is gone
        victim = data.draw(st.sampled_from(acked))
        only(check([e for e in events if e != victim]), "lost")
        redelivered = [
            e
            for e in events
            if isinstance(e, Delivery) and e.redelivered and e.message == victim.message
        ]
        if redelivered:
            unflagged = dataclasses.replace(redelivered[0], redelivered=False)
            assert "unflagged" in check(replaced(events, redelivered[0], unflagged)).counts
