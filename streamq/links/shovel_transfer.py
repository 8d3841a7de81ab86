"""One shovel session's bookkeeping: which source deliveries may be acked, and when.

Owns the mapping from what the destination settled (a publisher confirm, an HTTP 2xx)
back to the source's delivery tags, and the count of messages still to move when
`src-delete-after` is set. It must not touch connections: the session (shovel_session.py)
feeds it deliveries and confirms and sends the acks it asks for.

Why the mapping is a number and not a table: a session opens one source channel and one
destination channel, both fresh. Each delivery it forwards is published once, in order,
so the n-th forwarded message is both the destination's publish sequence number n and
the source delivery `first_tag + n - 1`. A confirm with `multiple` then settles a whole
prefix of source tags in O(1), and the source gets one `basic.ack multiple` per loop turn
however many messages that covers (RabbitMQ's shovel acks per confirm frame too).
Confirms that arrive singly and out of order wait in `_early` (bounded by the prefetch
count: no more than that many are ever unsettled).
"""

from __future__ import annotations

from typing import Final

SETTLED_AHEAD_MAX: Final = 65535  # out-of-order confirms held: the prefetch limit's bound


class Transfer:
    """What a session forwarded and what the destination settled."""

    def __init__(self, remaining: int | None) -> None:
        """`remaining`: messages to move before the shovel is done (None: no limit)."""
        self.remaining = remaining
        self.forwarded = 0  # messages handed to the destination (its sequence numbers)
        self.settled = 0  # the destination settled 1..settled (confirmed or refused)
        self.acked = 0  # the source was told about 1..acked
        self.tag_offset: int | None = None  # source delivery tag - sequence number
        self._early: set[int] = set()  # settled singly above `settled`
        self._refused: list[int] = []  # sequence numbers the destination nacked, to nack

    def take(self, count: int, first_tag: int) -> int:
        """How many of `count` deliveries, the first tagged `first_tag`, to forward now
        (the rest lie beyond `src-delete-after` and go back to the source unacked)."""
        if self.tag_offset is None:
            self.tag_offset = first_tag - 1
        # Deliveries on one channel are tagged 1, 2, 3...: a gap would break the mapping.
        assert first_tag == self.forwarded + 1 + self.tag_offset, "delivery tags skipped"
        if self.remaining is not None:
            count = min(count, self.remaining)
            self.remaining -= count
        self.forwarded += count
        return count

    @property
    def done(self) -> bool:
        """All `src-delete-after` messages forwarded and settled."""
        return self.remaining == 0 and self.settled == self.forwarded

    def confirm(self, sequence: int, multiple: bool, ack: bool) -> None:
        """The destination settled `sequence` (and all before it when `multiple`)."""
        if not ack:
            first = self.settled + 1 if multiple else sequence
            self._refused.extend(s for s in range(first, sequence + 1) if s not in self._early)
        if multiple:
            self.settled = max(self.settled, sequence)
            self._early = {s for s in self._early if s > self.settled}
        elif sequence == self.settled + 1:
            self.settled = sequence
        elif sequence > self.settled:
            if len(self._early) >= SETTLED_AHEAD_MAX:
                raise OverflowError("too many out-of-order confirms")  # a broken peer
            self._early.add(sequence)
        while self.settled + 1 in self._early:
            self.settled += 1
            self._early.discard(self.settled)

    def source_tag(self, sequence: int) -> int:
        assert self.tag_offset is not None
        return sequence + self.tag_offset

    def pending_acks(self) -> tuple[int | None, list[int]]:
        """(the source tag to ack with `multiple` now or None, the source tags to nack
        with requeue first); marks them as told."""
        refused = [self.source_tag(s) for s in self._refused]
        self._refused.clear()
        if self.settled <= self.acked:
            return None, refused
        self.acked = self.settled
        return self.source_tag(self.settled), refused
