"""A connection's Topic Aliases (mqtt_gateway/topic_aliases.py), both directions."""

from __future__ import annotations

from mqtt_gateway.codec import ReasonCode
from mqtt_gateway.topic_aliases import TopicAliases


def test_inbound_aliases_are_set_then_used() -> None:
    aliases = TopicAliases(2, 0)
    assert aliases.resolve("plain", None) == "plain"
    assert aliases.resolve("a/b", 1) == "a/b"
    assert aliases.resolve("", 1) == "a/b"
    assert aliases.resolve("c", 1) == "c"  # set again: replaced
    assert aliases.resolve("", 1) == "c"
    assert aliases.resolve("", 2) == ReasonCode.PROTOCOL_ERROR  # never set
    assert aliases.resolve("d", 3) == ReasonCode.TOPIC_ALIAS_INVALID  # past the maximum


def test_no_inbound_alias_without_a_maximum() -> None:
    assert TopicAliases(0, 0).resolve("a", 1) == ReasonCode.TOPIC_ALIAS_INVALID


def test_outbound_aliases_for_the_first_topics() -> None:
    aliases = TopicAliases(0, 2)
    assert aliases.outgoing("a/1") == ("a/1", 1)
    assert aliases.outgoing("a/1") == ("", 1)
    assert aliases.outgoing("x") == ("x", None)  # one byte: an alias saves nothing
    assert aliases.outgoing("b/2") == ("b/2", 2)
    assert aliases.outgoing("c/3") == ("c/3", None)  # all taken: by name
    assert aliases.outgoing("b/2") == ("", 2)
    assert TopicAliases(0, 0).outgoing("a/1") == ("a/1", None)


def test_a_proposed_alias_is_recorded_only_when_sent() -> None:
    """A PUBLISH dropped (past the client's Maximum Packet Size) sets no alias: the next
    topic is offered the same one, and only `record` makes it the topic's."""
    aliases = TopicAliases(0, 2)
    assert aliases.proposed("a/1") == ("a/1", 1)
    assert aliases.proposed("b/2") == ("b/2", 1)  # a/1's was never sent
    aliases.record("b/2", 1)
    assert aliases.proposed("b/2") == ("", 1)
    assert aliases.outgoing("a/1") == ("a/1", 2)
    assert aliases.proposed("c/3") == ("c/3", None)
