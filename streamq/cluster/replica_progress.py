"""How far a follower's copy may be read: `ReplicaProgress`.

Owns the three facts a follower learns from its replication connection that decide what
its stream reads may serve (`replica_log`): whether the copy is a consistent state of the
leader's (not during a full sync, which may cut and rewrite files), how many stream
bytes it has received (`received`: nothing on its disk came from later bytes), and the
leader's committed position (`committed`, from COMMITTED frames: every round recorded up
to there is on every in-sync replica and was released). Positions are those of one
replication connection; `epoch` counts connections, so that a reader drops what it
remembered in the positions of an earlier one. It reads no file and decides nothing; it
tells its listeners when something changed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

NO_COMMIT: Final = -1  # no COMMITTED frame yet on this connection


class ReplicaProgress:
    """What the follower's replication client knows now (used on the event loop)."""

    __slots__ = ("_listeners", "committed", "epoch", "readable", "received")

    def __init__(self) -> None:
        self.epoch = 0
        self.readable = False
        self.received = 0
        self.committed = NO_COMMIT
        self._listeners: set[Callable[[], None]] = set()

    def listen(self, listener: Callable[[], None]) -> None:
        self._listeners.add(listener)

    def unlisten(self, listener: Callable[[], None]) -> None:
        self._listeners.discard(listener)

    def stopped(self) -> None:
        """No connection, or one in its full sync: files may change under a reader."""
        self.readable = False

    def connected(self, start: int) -> None:
        """A connection's live stream starts at `start` (its positions from now on)."""
        self.epoch += 1
        self.received = start
        self.committed = NO_COMMIT

    def consistent(self) -> None:
        """The copy is a state of the leader's and follows its live stream."""
        self.readable = True
        self._notify()

    def commit(self, position: int) -> None:
        if position > self.committed:
            self.committed = position
            self._notify()

    def _notify(self) -> None:
        for listener in list(self._listeners):
            listener()
