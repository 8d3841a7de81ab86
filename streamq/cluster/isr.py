"""The leader's in-sync replica set and the rounds that wait for it.

Owns the decisions of the replication gate, as plain state with time passed in (no
sockets, no asyncio, one thread: the event loop's): which fsync rounds may be released,
which followers must leave the in-sync replicas (ISR), which may join, and how far each
follower lags. The `leader` module does the I/O these decisions call for (acks in,
`set_isr` out).

Rule 1: a round recorded at stream position p is released only when every member of the
local ISR but the leader has acked p, the lease is valid, and every earlier round is
released (in order).
Rule 2: a member leaves the local ISR only once etcd holds an ISR without it (the caller
writes `drops()` first, then calls `dropped`): rounds keep waiting for it meanwhile.
Rule 3: a follower joins the local ISR (`pending`) as soon as it is close to the stream's
end; rounds wait for it from then on, and it is written to etcd only once it has acked
every round released before it joined (`join_ready`), so no member of etcd's ISR ever
lacks a released round.
Rule 4: a new leader keeps the members of the ISR it was elected from (`inherited`): they
hold every round the old leader released, and rounds wait for them from the start. One
that has not reconnected and caught up (its full sync done, streaming) within the grace
period is dropped as by rule 2, as is one that leaves afterwards. So a second failover
right after the first can elect any of them.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

Done = Callable[[BaseException | None], None]

# A follower this close to the stream's end joins the local ISR (rule 3).
JOIN_LAG_BYTES_MAX: Final = 1 << 20
# Growth marks (stream position, time) kept to age the oldest unacked byte; marks closer
# than MARK_INTERVAL_S are merged (ages are then at most that much too old).
MARKS_MAX: Final = 65536
MARK_INTERVAL_S: Final = 0.001


@dataclass(slots=True)
class Follower:
    node_id: str
    address: str
    acked: int  # stream position acked (the stream start while syncing)
    state: Literal["syncing", "streaming"] = "syncing"
    # Its copy is a consistent state of ours once it acked this (the stream position when
    # its full sync ended); it may join the ISR only then.
    consistent_at: int = 0


@dataclass(slots=True)
class Pending:
    released: int  # the last released round's position when the follower joined
    written: bool = False  # a join write was tried: etcd may hold it (rule 2 applies)
    failed: bool = False  # that write failed: drop it with the next ISR write


@dataclass(frozen=True, slots=True)
class FollowerStatus:
    node_id: str
    address: str
    state: str
    in_isr: bool
    acked: int
    lag_bytes: int
    lag_s: float


class IsrState:
    def __init__(
        self,
        node_id: str,
        position: int,
        now: float,
        inherited: frozenset[str] = frozenset(),
        grace_s: float = 0.0,
    ) -> None:
        """`inherited`: members of the ISR this leader was elected from, which etcd
        holds with it; each gets until `now + grace_s` to reconnect (rule 4)."""
        self.node_id = node_id
        self.committed: set[str] = {node_id} | inherited  # what etcd holds (as we know)
        self.inherited_until = {member: now + grace_s for member in inherited - {node_id}}
        self.pending: dict[str, Pending] = {}
        self.followers: dict[str, Follower] = {}
        self.held: deque[tuple[int, Done]] = deque()
        self.released = 0
        self.position = position
        self._marks: deque[tuple[int, float]] = deque([(position, now)])

    @property
    def isr(self) -> frozenset[str]:
        return frozenset(self.committed | self.pending.keys())

    def grown(self, position: int, now: float) -> None:
        """The stream reached `position` at `now`."""
        if position <= self.position:
            return
        self.position = position
        last_time = self._marks[-1][1]
        if now - last_time < MARK_INTERVAL_S:
            self._marks[-1] = (position, last_time)
        else:
            self._marks.append((position, now))
            if len(self._marks) > MARKS_MAX:
                self._marks.popleft()
        self._trim_marks()

    def hold(self, position: int, done: Done, now: float) -> None:
        """A round recorded at stream `position` waits for the ISR."""
        assert not self.held or self.held[-1][0] <= position
        self.grown(position, now)
        self.held.append((position, done))

    def ack(self, node_id: str, position: int) -> None:
        """A follower acked `position`; it joins the local ISR if it is close (rule 3)."""
        follower = self.followers[node_id]
        follower.acked = max(follower.acked, position)
        if (
            node_id not in self.committed
            and node_id not in self.pending
            and follower.state == "streaming"
            and follower.acked >= follower.consistent_at
            and self.position - follower.acked <= JOIN_LAG_BYTES_MAX
        ):
            self.pending[node_id] = Pending(self.released)
        self._trim_marks()

    def releasable(self, *, lease_valid: bool) -> list[Done]:
        """Remove and return the rounds that may be released now (rule 1), in order."""
        if not self.held or not lease_valid:
            return []
        covered = self._covered()
        ready = []
        while self.held and self.held[0][0] <= covered:
            position, done = self.held.popleft()
            self.released = max(self.released, position)
            ready.append(done)
        return ready

    def _covered(self) -> int:
        """The stream position every local ISR follower has acked."""
        covered = self.held[-1][0] if self.held else self.position
        for node_id in self.isr:
            if node_id == self.node_id:
                continue
            follower = self.followers.get(node_id)
            if follower is None or follower.state != "streaming":
                return -1
            covered = min(covered, follower.acked)
        return covered

    def drops(self, now: float, ack_timeout_s: float) -> set[str]:
        """Local ISR members that must leave: gone, resyncing, or with an unacked byte
        older than `ack_timeout_s`. Pending ones no write has named are dropped here
        locally (etcd never held them); the rest need an ISR write first (rule 2)."""
        late = set()
        for node_id in self.isr - {self.node_id}:
            follower = self.followers.get(node_id)
            if self._in_grace(node_id, follower, now):
                continue
            if (
                follower is None
                or follower.state != "streaming"
                or self.lag_s(follower, now) > ack_timeout_s
                or self.pending.get(node_id, Pending(0)).failed
            ):
                late.add(node_id)
        for node_id in list(late):
            pending = self.pending.get(node_id)
            if pending is not None and not pending.written:
                del self.pending[node_id]
                late.discard(node_id)
        return late

    def _in_grace(self, node_id: str, follower: Follower | None, now: float) -> bool:
        """An inherited member still reconnecting or syncing within its grace (rule 4);
        once it streams, or its grace ends, the other rules apply to it."""
        until = self.inherited_until.get(node_id)
        if until is None:
            return False
        if now >= until or (follower is not None and follower.state == "streaming"):
            del self.inherited_until[node_id]
            return False
        return True

    def dropped(self, node_ids: set[str]) -> None:
        """etcd now holds `committed - node_ids` (rule 2)."""
        self.committed -= node_ids
        for node_id in node_ids:
            self.pending.pop(node_id, None)

    def join_ready(self) -> list[str]:
        """Pending followers that acked every round released before they joined."""
        return [
            node_id
            for node_id, pending in self.pending.items()
            if not pending.written
            and node_id in self.followers
            and self.followers[node_id].acked >= pending.released
        ]

    def joined(self, node_id: str, *, ok: bool | None) -> None:
        """The join write of `node_id` returned ok (True), was refused (False: nothing
        written), or failed with an unknown outcome (None)."""
        pending = self.pending.get(node_id)
        if pending is None:
            return
        if ok:
            del self.pending[node_id]
            self.committed.add(node_id)
        elif ok is False:
            del self.pending[node_id]
        else:
            pending.written = pending.failed = True

    def remove_follower(self, node_id: str, follower: Follower) -> None:
        if self.followers.get(node_id) is follower:
            del self.followers[node_id]

    def lag_s(self, follower: Follower, now: float) -> float:
        """Age of the oldest byte the follower has not acked (0 when it has all)."""
        if follower.acked >= self.position:
            return 0.0
        at = bisect.bisect_right(self._marks, follower.acked, key=lambda mark: mark[0])
        return max(0.0, now - self._marks[min(at, len(self._marks) - 1)][1])

    def status(self, now: float) -> list[FollowerStatus]:
        isr = self.isr
        return [
            FollowerStatus(
                follower.node_id,
                follower.address,
                follower.state,
                follower.node_id in isr,
                follower.acked,
                max(0, self.position - follower.acked),
                self.lag_s(follower, now),
            )
            for follower in self.followers.values()
        ]

    def _trim_marks(self) -> None:
        """Forget marks every follower is past (one is always kept)."""
        slowest = min(
            (follower.acked for follower in self.followers.values()), default=self.position
        )
        while len(self._marks) > 1 and self._marks[1][0] <= slowest:
            self._marks.popleft()
