"""Retention rules: which whole segments go, and the arguments that set them."""

from __future__ import annotations

import pytest

from retention.rules import (
    RetentionRules,
    RuleInvalid,
    drop_before,
    parse_age_ms,
    rules_from_arguments,
)
from streamq.log.log import SegmentInfo


def segments(*sizes: tuple[int, int, int], active_last: bool = True) -> list[SegmentInfo]:
    """Segments of (messages, bytes, last timestamp) each, from offset 0."""
    out = []
    base = 0
    for index, (count, size, last_ms) in enumerate(sizes):
        active = active_last and index == len(sizes) - 1
        out.append(SegmentInfo(base, base + count, size, last_ms - 1, last_ms, active))
        base += count
    return out


LOG = segments((10, 1000, 100), (10, 1000, 200), (10, 1000, 300), (5, 500, 400))


def test_nothing_goes_without_rules() -> None:
    assert drop_before(LOG, RetentionRules(), 10_000) == 0


@pytest.mark.parametrize(
    ("rules", "cut"),
    [
        (RetentionRules(max_length=35), 0),
        (RetentionRules(max_length=34), 10),  # one segment too many: the oldest goes
        (RetentionRules(max_length=15), 20),
        (RetentionRules(max_length=0), 30),  # never the active segment
        (RetentionRules(max_length_bytes=3500), 0),
        (RetentionRules(max_length_bytes=2400), 20),
        (RetentionRules(max_age_ms=1000), 0),
        (RetentionRules(max_age_ms=10), 20),  # now 310: segments ending at 100 and 200 go
        (RetentionRules(max_length=34, max_age_ms=10), 20),  # each rule can drop
    ],
)
def test_whole_segments_go_oldest_first(rules: RetentionRules, cut: int) -> None:
    assert drop_before(LOG, rules, 310) == cut


def test_the_stricter_value_wins() -> None:
    argument = RetentionRules(max_length=100, max_age_ms=5000)
    policy = RetentionRules(max_length=50, max_length_bytes=10)
    assert argument.stricter(policy) == RetentionRules(50, 10, 5000)


def test_arguments() -> None:
    assert rules_from_arguments({"x-max-length": 5, "x-max-age": "7D"}) == RetentionRules(
        5, None, 7 * 86_400_000
    )
    assert parse_age_ms("1Y") == 365 * 86_400_000
    with pytest.raises(RuleInvalid, match="invalid x-max-age '7d'"):
        rules_from_arguments({"x-max-age": "7d"})
    with pytest.raises(RuleInvalid, match="invalid x-max-length-bytes -1"):
        rules_from_arguments({"x-max-length-bytes": -1})
