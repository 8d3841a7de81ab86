"""Retention rules and the choice of segments they drop.

Owns `x-max-length`, `x-max-length-bytes` and `x-max-age` (as queue arguments; policies
will feed the same rules, the stricter value winning) and the decision of which whole
segments of a log go: the oldest ones, while the log holds more messages or bytes than
allowed, and those whose newest message is older than the maximum age. Never the active
segment. It reads segment metadata only; it deletes nothing itself (the log does), and
knows no AMQP.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from streamq.durations import age_ms
from streamq.log.log import SegmentInfo


class RuleInvalid(ValueError):
    """A retention argument or policy value that is not valid; the message says why."""


@dataclass(frozen=True, slots=True)
class RetentionRules:
    max_length: int | None = None  # messages
    max_length_bytes: int | None = None  # bytes of segments
    max_age_ms: int | None = None

    @property
    def empty(self) -> bool:
        return self.max_length is None and self.max_length_bytes is None and self.max_age_ms is None

    def stricter(self, other: RetentionRules) -> RetentionRules:
        """Each limit the smaller of the two (a queue argument against a policy)."""
        return RetentionRules(
            _smaller(self.max_length, other.max_length),
            _smaller(self.max_length_bytes, other.max_length_bytes),
            _smaller(self.max_age_ms, other.max_age_ms),
        )


def _smaller(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def parse_age_ms(value: object) -> int:
    """`7D`, `12h`, `30m`, `1Y` in milliseconds. Raises RuleInvalid."""
    milliseconds = age_ms(value)
    if milliseconds is None:
        raise RuleInvalid(f"invalid max-age {value!r}: expected a count and one of Y M D h m s")
    return milliseconds


def _count(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RuleInvalid(f"invalid {what} {value!r}: expected a non-negative integer")
    return value


def rules_from_arguments(arguments: Mapping[str, object]) -> RetentionRules:
    """The rules a queue's arguments set. Raises RuleInvalid naming the bad argument."""
    length = arguments.get("x-max-length")
    size = arguments.get("x-max-length-bytes")
    age = arguments.get("x-max-age")
    try:
        return RetentionRules(
            None if length is None else _count(length, "x-max-length"),
            None if size is None else _count(size, "x-max-length-bytes"),
            None if age is None else parse_age_ms(age),
        )
    except RuleInvalid as exc:
        raise RuleInvalid(str(exc).replace("max-age", "x-max-age", 1)) from None


def drop_before(segments: Sequence[SegmentInfo], rules: RetentionRules, now_ms: int) -> int:
    """The offset below which the rules drop every segment (whole segments, oldest
    first, never the active one); the log's start offset when nothing is to go."""
    if not segments:
        return 0
    messages = segments[-1].next_offset - segments[0].base_offset
    size = sum(s.size_bytes for s in segments)
    cut = segments[0].base_offset
    for segment in segments:
        if segment.active:
            break
        too_many = rules.max_length is not None and messages > rules.max_length
        too_big = rules.max_length_bytes is not None and size > rules.max_length_bytes
        too_old = (
            rules.max_age_ms is not None
            and segment.next_offset > segment.base_offset
            and segment.last_timestamp_ms < now_ms - rules.max_age_ms
        )
        if not (too_many or too_big or too_old):
            break
        messages -= segment.next_offset - segment.base_offset
        size -= segment.size_bytes
        cut = segment.next_offset
    return cut


def rules_from_policy(definition: Mapping[str, object]) -> RetentionRules:
    """The rules of a policy definition (`max-length`, `max-length-bytes`, `max-age`);
    values were validated when the policy was set."""
    length = definition.get("max-length")
    size = definition.get("max-length-bytes")
    age = definition.get("max-age")
    return RetentionRules(
        length if isinstance(length, int) else None,
        size if isinstance(size, int) else None,
        age_ms(age),
    )
