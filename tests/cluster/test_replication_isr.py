"""The ISR rules of streamq.cluster.isr as plain state, time passed in: rounds release in
order once every local ISR member acked them; drops wait for the store; a follower joins
locally when close and is written only once it acked every round released before."""

from __future__ import annotations

from streamq.cluster.isr import JOIN_LAG_BYTES_MAX, Follower, IsrState


def rounds(state: IsrState, *positions: int) -> list[int]:
    released: list[int] = []
    for position in positions:
        state.hold(position, lambda exc, p=position: released.append(p), now=0.0)
    return released


def release(state: IsrState, *, lease_valid: bool = True) -> None:
    for done in state.releasable(lease_valid=lease_valid):
        done(None)


def streaming(state: IsrState, node_id: str, acked: int) -> Follower:
    follower = Follower(node_id, "127.0.0.1", acked, "streaming")
    state.followers[node_id] = follower
    return follower


def test_leader_alone_releases_at_once_unless_the_lease_is_doubtful() -> None:
    state = IsrState("L", 0, 0.0)
    released = rounds(state, 10, 20)
    release(state, lease_valid=False)
    assert released == []
    release(state)
    assert released == [10, 20]
    assert state.released == 20


def test_rounds_wait_for_every_member_in_order() -> None:
    state = IsrState("L", 0, 0.0)
    state.committed |= {"a", "b"}
    a, b = streaming(state, "a", 0), streaming(state, "b", 0)
    released = rounds(state, 10, 20, 30)
    a.acked, b.acked = 25, 15
    release(state)
    assert released == [10]
    b.acked = 40
    release(state)
    assert released == [10, 20]
    a.acked = 30
    release(state)
    assert released == [10, 20, 30]


def test_a_member_without_a_streaming_connection_blocks_rounds() -> None:
    state = IsrState("L", 0, 0.0)
    state.committed.add("a")
    released = rounds(state, 5)
    release(state)
    assert released == []
    state.followers["a"] = Follower("a", "h", 100)  # syncing again
    release(state)
    assert released == []


def test_late_and_gone_members_are_dropped_only_through_the_store() -> None:
    state = IsrState("L", 0, 0.0)
    state.committed |= {"a", "b"}
    streaming(state, "a", 0)
    streaming(state, "b", 0)
    state.grown(100, now=1.0)
    state.ack("a", 100)
    assert state.drops(now=2.0, ack_timeout_s=3.0) == set()
    assert state.drops(now=4.5, ack_timeout_s=3.0) == {"b"}  # b's oldest byte is 3.5 s old
    released = rounds(state, 100)
    release(state)
    assert released == []  # b is still a member until the store says otherwise
    state.dropped({"b"})
    release(state)
    assert released == [100]
    del state.followers["a"]
    assert state.drops(now=4.5, ack_timeout_s=3.0) == {"a"}


def test_join_waits_for_every_round_released_before_it() -> None:
    state = IsrState("L", 0, 0.0)
    released: list[int] = []
    state.hold(50, lambda exc: released.append(50), now=0.0)
    release(state)
    follower = streaming(state, "f", 0)
    state.grown(60, now=1.0)
    state.ack("f", 40)  # close enough: joins locally
    assert "f" in state.isr and "f" in state.pending
    assert state.join_ready() == []  # it lacks round 50, released before it joined
    state.hold(60, lambda exc: released.append(60), now=1.0)
    release(state)
    assert released == [50]  # round 60 waits for f now
    state.ack("f", 60)
    release(state)
    assert released == [50, 60]
    assert state.join_ready() == ["f"]
    state.joined("f", ok=True)
    assert state.committed == {"L", "f"} and not state.pending
    assert follower.acked == 60


def test_far_or_inconsistent_followers_do_not_join() -> None:
    state = IsrState("L", 0, 0.0)
    state.grown(JOIN_LAG_BYTES_MAX + 10, now=0.0)
    streaming(state, "far", 0)
    state.ack("far", 5)
    follower = streaming(state, "fresh", 0)
    follower.consistent_at = JOIN_LAG_BYTES_MAX + 10
    state.ack("fresh", JOIN_LAG_BYTES_MAX + 5)
    assert state.isr == {"L"}


def test_a_join_write_of_unknown_outcome_leaves_only_through_a_later_write() -> None:
    state = IsrState("L", 0, 0.0)
    streaming(state, "f", 0)
    state.ack("f", 0)
    state.joined("f", ok=None)  # etcd may hold it
    assert "f" in state.isr
    assert state.drops(now=0.0, ack_timeout_s=3.0) == {"f"}
    state.dropped({"f"})
    assert state.isr == {"L"}


def test_a_refused_join_is_taken_out_and_an_unwritten_late_one_dropped_locally() -> None:
    state = IsrState("L", 0, 0.0)
    streaming(state, "f", 0)
    state.ack("f", 0)
    state.joined("f", ok=False)
    assert state.isr == {"L"}
    state.ack("f", 0)
    state.grown(10, now=1.0)
    assert state.drops(now=10.0, ack_timeout_s=3.0) == set()  # never written: local only
    assert state.isr == {"L"}


def test_lag_is_the_age_of_the_oldest_unacked_byte() -> None:
    state = IsrState("L", 0, 0.0)
    follower = streaming(state, "f", 0)
    state.grown(100, now=1.0)
    state.grown(200, now=2.0)
    assert state.lag_s(follower, now=5.0) == 4.0
    state.ack("f", 100)
    assert state.lag_s(follower, now=5.0) == 3.0
    state.ack("f", 200)  # close to the end: it joins the local ISR
    assert state.lag_s(follower, now=5.0) == 0.0
    [status] = state.status(now=5.0)
    assert (status.lag_bytes, status.in_isr, status.state) == (0, True, "streaming")


def test_a_new_leader_keeps_the_members_it_was_elected_from_for_their_grace() -> None:
    """Rule 4: inherited members are in the ISR from the start, rounds wait for them,
    and one that is away or still syncing is dropped only once its grace is over."""
    state = IsrState("L", 0, 0.0, frozenset({"a", "b", "L"}), grace_s=3.0)
    assert state.isr == {"L", "a", "b"}
    released = rounds(state, 10)
    assert state.drops(now=1.0, ack_timeout_s=3.0) == set()  # neither has reconnected yet
    state.followers["a"] = Follower("a", "h", 0)  # a reconnected: its full sync runs
    assert state.drops(now=2.9, ack_timeout_s=3.0) == set()
    release(state)
    assert released == []  # the round waits for both
    a = streaming(state, "a", 0)
    state.grown(10, now=3.0)
    a.acked = 10
    assert state.drops(now=3.5, ack_timeout_s=3.0) == {"b"}  # b's grace is over
    state.dropped({"b"})
    release(state)
    assert released == [10]
    assert state.isr == {"L", "a"}


def test_an_inherited_member_that_streams_is_judged_by_the_usual_rules() -> None:
    state = IsrState("L", 0, 0.0, frozenset({"a"}), grace_s=30.0)
    a = streaming(state, "a", 0)
    state.grown(100, now=1.0)
    assert state.drops(now=2.0, ack_timeout_s=3.0) == set()
    a.state = "syncing"  # streamed, then fell back to a full sync: no grace any more
    assert state.drops(now=2.0, ack_timeout_s=3.0) == {"a"}
