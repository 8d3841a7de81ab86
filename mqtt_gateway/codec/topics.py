"""Topic names and topic filters (MQTT 5.0 section 4.7; 3.1.1 section 4.7).

This module owns the syntax only: where wildcards may stand, how many levels a topic may
have, and how a shared subscription `$share/{ShareName}/{filter}` splits (5.0 section
4.8.2). Matching and the mapping onto routing keys belong to the session, not here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from mqtt_gateway.codec.constants import TOPIC_LEVELS_MAX
from mqtt_gateway.codec.errors import TopicFilterInvalid, TopicNameInvalid

SEPARATOR: Final = "/"
SINGLE_LEVEL: Final = "+"
MULTI_LEVEL: Final = "#"
SHARE_PREFIX: Final = "$share/"
_WILDCARDS: Final = frozenset(SINGLE_LEVEL + MULTI_LEVEL)


@dataclass(frozen=True, slots=True)
class SharedFilter:
    """A shared subscription's parts: `$share/{share_name}/{topic_filter}`."""

    share_name: str
    topic_filter: str


def _check_levels(topic: str, what: str, error: type[Exception]) -> None:
    if topic.count(SEPARATOR) >= TOPIC_LEVELS_MAX:
        raise error(f"{what}: more than {TOPIC_LEVELS_MAX} levels")


def check_topic_name(topic: str) -> None:
    """Refuse a topic name with a wildcard (MQTT-3.3.2-2) or too many levels.

    An empty name is the caller's to judge (5.0 allows it with a Topic Alias)."""
    if _WILDCARDS.intersection(topic):
        raise TopicNameInvalid(f"topic name {topic!r} holds a wildcard")
    _check_levels(topic, "topic name", TopicNameInvalid)


def check_topic_filter(topic_filter: str) -> None:
    """Refuse a filter that is empty (MQTT-4.7.3-1), has `#` anywhere but as the whole
    last level (MQTT-4.7.1-1), `+` as part of a level (MQTT-4.7.1-2), too many levels,
    or a `$share/` prefix without a valid share name and filter (MQTT-4.8.2-1, -2)."""
    if not topic_filter:
        raise TopicFilterInvalid("empty topic filter")
    _check_levels(topic_filter, "topic filter", TopicFilterInvalid)
    shared = parse_shared(topic_filter)
    plain = topic_filter if shared is None else shared.topic_filter
    levels = plain.split(SEPARATOR)
    for index, level in enumerate(levels):
        if MULTI_LEVEL in level and (level != MULTI_LEVEL or index != len(levels) - 1):
            raise TopicFilterInvalid(f"topic filter {topic_filter!r}: '#' not the last level")
        if SINGLE_LEVEL in level and level != SINGLE_LEVEL:
            raise TopicFilterInvalid(f"topic filter {topic_filter!r}: '+' inside a level")


def parse_shared(topic_filter: str) -> SharedFilter | None:
    """Split a `$share/{ShareName}/{filter}` filter; None for a filter that is not shared.

    Raises `TopicFilterInvalid` for an empty share name, one holding a wildcard, or a
    missing or empty filter after it. The filter part's wildcards are not checked here
    (check_topic_filter does)."""
    if not topic_filter.startswith(SHARE_PREFIX):
        return None
    share_name, separator, rest = topic_filter[len(SHARE_PREFIX) :].partition(SEPARATOR)
    if not share_name or _WILDCARDS.intersection(share_name):
        raise TopicFilterInvalid(f"shared subscription {topic_filter!r}: bad share name")
    if not separator or not rest:
        raise TopicFilterInvalid(f"shared subscription {topic_filter!r}: no topic filter")
    return SharedFilter(share_name, rest)
