"""Hypothesis strategies for valid MQTT packets of each protocol level.

Every value drawn is one the codec must encode and decode back to itself: topic names
without wildcards, filters with them in legal places (and `$share/` ones), properties
valid for the packet they are drawn for (MQTT 5.0 only), reason codes from each packet's
table, packet identifiers 1-65535.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from mqtt_gateway.codec import packets as p
from mqtt_gateway.codec.constants import PacketType, ProtocolLevel
from mqtt_gateway.codec.properties import NO_PROPERTIES, SPECS, WILL, Properties, PropertyType
from mqtt_gateway.codec.reason_codes import (
    CONNACK_RETURN_CODES_V3,
    REASON_CODES_V5,
    SUBACK_RETURN_CODES_V31,
    SUBACK_RETURN_CODES_V311,
)

V5 = ProtocolLevel.MQTT_5
LEVELS = list(ProtocolLevel)

text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    max_size=12,
)
level_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00/+#"),
    max_size=6,
)
topic_names = st.lists(level_text, min_size=1, max_size=5).map("/".join).filter(bool)
packet_ids = st.integers(1, 0xFFFF)
qos = st.integers(0, 2)
payloads = st.binary(max_size=64)


@st.composite
def topic_filters(draw: st.DrawFn) -> str:
    levels = draw(st.lists(st.one_of(st.just("+"), level_text), min_size=1, max_size=5))
    if draw(st.booleans()):
        levels.append("#")
    topic_filter = "/".join(levels)
    if not topic_filter:
        topic_filter = "#"
    if draw(st.booleans()):
        group = draw(level_text.filter(bool))
        topic_filter = f"$share/{group}/{topic_filter}"
    return topic_filter


_VALUES: dict[PropertyType, st.SearchStrategy[Any]] = {
    PropertyType.BYTE: st.integers(0, 1),
    PropertyType.TWO_BYTE: st.integers(1, 0xFFFF),
    PropertyType.FOUR_BYTE: st.integers(1, 0xFFFFFFFF),
    PropertyType.VARINT: st.integers(1, 268_435_455),
    PropertyType.UTF8: text,
    PropertyType.BINARY: st.binary(max_size=16),
    PropertyType.UTF8_PAIR: st.tuples(text, text),
}


@st.composite
def properties(draw: st.DrawFn, context: int) -> Properties:
    fields: dict[str, Any] = {}
    for spec in SPECS.values():
        if context not in spec.contexts or not draw(st.booleans()):
            continue
        value = _VALUES[spec.type]
        if spec.name in ("user_properties", "subscription_identifiers"):
            most = 3 if context in spec.repeatable_in else 1
            fields[spec.name] = tuple(draw(st.lists(value, min_size=1, max_size=most)))
        else:
            fields[spec.name] = draw(value)
    if "authentication_data" in fields:
        fields.setdefault("authentication_method", draw(text))
    return Properties(**fields)


def props(level: ProtocolLevel, context: int) -> st.SearchStrategy[Properties]:
    return properties(context) if level is V5 else st.just(NO_PROPERTIES)


@st.composite
def connects(draw: st.DrawFn, level: ProtocolLevel) -> p.Connect:
    clean = draw(st.booleans())
    if level is ProtocolLevel.MQTT_3_1:
        client_id = draw(st.text(st.characters(max_codepoint=127, blacklist_characters="\x00"),
                                 min_size=1, max_size=23))  # fmt: skip
    else:
        client_id = draw(text)
        if level is ProtocolLevel.MQTT_3_1_1 and not client_id:
            clean = True
    will = None
    if draw(st.booleans()):
        will = p.Will(draw(topic_names), draw(payloads), draw(qos), draw(st.booleans()),
                      draw(props(level, WILL)))  # fmt: skip
    username = draw(st.none() | text)
    password = draw(st.none() | st.binary(max_size=8))
    if level is not V5 and username is None:
        password = None
    return p.Connect(level, client_id, clean, draw(st.integers(0, 0xFFFF)), username, password,
                     will, draw(props(level, PacketType.CONNECT)))  # fmt: skip


@st.composite
def publishes(draw: st.DrawFn, level: ProtocolLevel) -> p.Publish:
    qos_ = draw(qos)
    properties_ = draw(props(level, PacketType.PUBLISH))
    topic = draw(topic_names)
    if properties_.topic_alias is not None and draw(st.booleans()):
        topic = ""
    return p.Publish(topic, draw(payloads), qos_, draw(st.booleans()),
                     qos_ > 0 and draw(st.booleans()), draw(packet_ids) if qos_ else None,
                     properties_)  # fmt: skip


def _acks(cls: Any, level: ProtocolLevel) -> st.SearchStrategy[Any]:
    if level is not V5:
        return st.builds(cls, packet_ids)
    codes = st.sampled_from(sorted(REASON_CODES_V5[cls.type]))
    return st.builds(cls, packet_ids, codes, props(level, cls.type))


def _suback_codes(level: ProtocolLevel) -> list[int]:
    if level is V5:
        return sorted(REASON_CODES_V5[PacketType.SUBACK])
    if level is ProtocolLevel.MQTT_3_1:
        return sorted(SUBACK_RETURN_CODES_V31)
    return sorted(SUBACK_RETURN_CODES_V311)


@st.composite
def subscriptions(draw: st.DrawFn, level: ProtocolLevel) -> p.Subscription:
    topic_filter = draw(topic_filters())
    if level is not V5:
        return p.Subscription(topic_filter, draw(qos))
    no_local = not topic_filter.startswith("$share/") and draw(st.booleans())
    return p.Subscription(topic_filter, draw(qos), no_local, draw(st.booleans()),
                          draw(st.integers(0, 2)))  # fmt: skip


def packets(level: ProtocolLevel) -> st.SearchStrategy[Any]:
    """Any valid packet of `level` (CONNECT included)."""
    return st.one_of(list(packet_strategies(level).values()))


def packet_strategies(level: ProtocolLevel) -> dict[type, st.SearchStrategy[Any]]:
    """A strategy per packet class that `level` has."""
    v5 = level is V5
    connack_codes = sorted(REASON_CODES_V5[PacketType.CONNACK] if v5 else CONNACK_RETURN_CODES_V3)
    connacks = st.builds(
        lambda code, present, properties_: p.ConnAck(
            code, present and code == 0 and level is not ProtocolLevel.MQTT_3_1, properties_
        ),
        st.sampled_from(connack_codes), st.booleans(), props(level, PacketType.CONNACK),
    )  # fmt: skip
    choices: list[st.SearchStrategy[Any]] = [
        connects(level),
        connacks,
        publishes(level),
        *(_acks(cls, level) for cls in (p.PubAck, p.PubRec, p.PubRel, p.PubComp)),
        st.builds(p.Subscribe, packet_ids, st.lists(subscriptions(level), min_size=1,
                  max_size=4).map(tuple), props(level, PacketType.SUBSCRIBE)),
        st.builds(p.SubAck, packet_ids, st.lists(st.sampled_from(_suback_codes(level)),
                  min_size=1, max_size=4).map(tuple), props(level, PacketType.SUBACK)),
        st.builds(p.Unsubscribe, packet_ids, st.lists(topic_filters(), min_size=1,
                  max_size=4).map(tuple), props(level, PacketType.UNSUBSCRIBE)),
        st.just(p.PingReq()),
        st.just(p.PingResp()),
    ]  # fmt: skip
    if v5:
        unsuback_codes = st.sampled_from(sorted(REASON_CODES_V5[PacketType.UNSUBACK]))
        choices += [
            st.builds(p.UnsubAck, packet_ids, st.lists(unsuback_codes, min_size=1,
                      max_size=4).map(tuple), props(level, PacketType.UNSUBACK)),
            st.builds(p.Disconnect, st.sampled_from(sorted(REASON_CODES_V5[PacketType.DISCONNECT])),
                      props(level, PacketType.DISCONNECT)),
            st.builds(p.Auth, st.sampled_from(sorted(REASON_CODES_V5[PacketType.AUTH])),
                      props(level, PacketType.AUTH)),
        ]  # fmt: skip
    else:
        choices += [st.builds(p.UnsubAck, packet_ids), st.just(p.Disconnect())]
    classes = [p.Connect, p.ConnAck, p.Publish, p.PubAck, p.PubRec, p.PubRel, p.PubComp,
               p.Subscribe, p.SubAck, p.Unsubscribe, p.PingReq, p.PingResp, p.UnsubAck,
               p.Disconnect, p.Auth]  # fmt: skip
    return dict(zip(classes, choices, strict=False))
