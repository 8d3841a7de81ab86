"""A connection's MQTT 5.0 Topic Aliases, both directions (section 3.3.2.3.4).

Owns `TopicAliases`: the client's aliases (inbound: up to the Topic Alias Maximum our
CONNACK announced, `[mqtt] topic_alias_maximum`, RabbitMQ's `mqtt.topic_alias_maximum`)
and ours (outbound: up to the Topic Alias Maximum of the client's CONNECT, within ours).
Inbound, a PUBLISH with a topic name and an alias sets the alias; one with an empty
topic name uses it; an alias past the maximum is "Topic Alias invalid" (0x94), an empty
topic name with an alias never set a protocol error (0x82). Outbound, as RabbitMQ 3.13
does, the first topics delivered take the aliases 1, 2, ... in turn, their first PUBLISH
carrying the topic name and the alias, the next ones an empty topic name; once all are
taken the other topics go out by name, as do one-byte topics (an alias saves nothing
there). Aliases live with the connection only (MQTT-3.3.2-7): a new connection starts
with none. Both maps are bounded by their maxima (at most 65,535).
"""

from __future__ import annotations

from mqtt_gateway.codec import ReasonCode


class TopicAliases:
    """The Topic Alias mappings of one MQTT 5.0 connection."""

    __slots__ = ("inbound", "inbound_max", "outbound", "outbound_max")

    def __init__(self, inbound_max: int, outbound_max: int) -> None:
        self.inbound_max = inbound_max
        self.outbound_max = outbound_max
        self.inbound: dict[int, str] = {}  # alias -> topic, the client's
        self.outbound: dict[str, int] = {}  # topic -> alias, ours

    def resolve(self, topic: str, alias: int | None) -> str | ReasonCode:
        """The topic name of a client's PUBLISH (recording the alias it sets), or the
        DISCONNECT reason code refusing it."""
        if alias is None:
            return topic
        if alias > self.inbound_max:
            return ReasonCode.TOPIC_ALIAS_INVALID
        if topic:
            self.inbound[alias] = topic
            return topic
        known = self.inbound.get(alias)
        return ReasonCode.PROTOCOL_ERROR if known is None else known

    def outgoing(self, topic: str) -> tuple[str, int | None]:
        """The topic name and Topic Alias of a PUBLISH to the client; the caller sends
        it (the mapping holds from this packet on)."""
        name, alias = self.proposed(topic)
        if name and alias is not None:
            self.record(topic, alias)
        return name, alias

    def proposed(self, topic: str) -> tuple[str, int | None]:
        """`outgoing`'s answer without recording a new alias: for a PUBLISH that may yet
        go unsent (past the client's Maximum Packet Size); `record` once it is sent."""
        alias = self.outbound.get(topic)
        if alias is not None:
            return "", alias
        if len(self.outbound) < self.outbound_max and len(topic.encode()) > 1:
            return topic, len(self.outbound) + 1
        return topic, None

    def record(self, topic: str, alias: int) -> None:
        """A PUBLISH setting `alias` for `topic` went out (`proposed` offered it)."""
        assert alias == len(self.outbound) + 1 and topic not in self.outbound
        self.outbound[topic] = alias
