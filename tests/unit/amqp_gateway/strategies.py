"""Hypothesis strategies and pamqp adapters shared by the codec tests.

Two families of values: `field_tables` uses every type and range our codec supports;
`pamqp_tables` stays inside what pamqp can encode and decode without loss (int64 ints,
float32-exact floats, timestamps below 2**32, decimals with an int32 mantissa,
bytearray for `x`), so the cross-checks compare like with like.
"""

from __future__ import annotations

import datetime
from dataclasses import fields
from decimal import Decimal
from typing import Any

from hypothesis import strategies as st
from pamqp import commands as pamqp_commands

from amqp_gateway.codec.methods import Method
from amqp_gateway.codec.properties import BasicProperties
from amqp_gateway.codec.spec import FieldSpec, Kind
from amqp_gateway.codec.values import (
    Float32,
    Int8,
    Int16,
    Int64,
    Timestamp,
    UInt8,
    UInt16,
    UInt32,
)

# At most 4 UTF-8 bytes per character: 60 characters always fit a shortstr.
shortstr_text = st.text(max_size=60)
table_keys = st.text(max_size=30)
decimals = st.builds(
    lambda scale, unscaled: Decimal(unscaled).scaleb(-scale),
    st.integers(0, 255),
    st.integers(0, 2**32 - 1),
)
scalar_values = st.one_of(
    st.booleans(),
    st.integers(-(2**7), 2**7 - 1).map(Int8),
    st.integers(0, 2**8 - 1).map(UInt8),
    st.integers(-(2**15), 2**15 - 1).map(Int16),
    st.integers(0, 2**16 - 1).map(UInt16),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(0, 2**32 - 1).map(UInt32),
    st.integers(-(2**63), 2**63 - 1).map(Int64),
    st.floats(width=32, allow_nan=False).map(Float32),
    st.floats(allow_nan=False),
    decimals,
    st.text(max_size=40),
    st.integers(0, 2**64 - 1).map(Timestamp),
    st.none(),
    st.binary(max_size=40),
)
field_values = st.recursive(
    scalar_values,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(table_keys, children, max_size=4)
    ),
    max_leaves=12,
)
field_tables = st.dictionaries(table_keys, field_values, max_size=6)

pamqp_scalar_values = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(width=32, allow_nan=False, allow_infinity=False),
    st.builds(
        lambda scale, unscaled: Decimal(unscaled).scaleb(-scale),
        st.integers(0, 255),
        st.integers(0, 2**31 - 1),
    ),
    st.text(max_size=40),
    st.integers(0, 2**32 - 1).map(Timestamp),
    st.none(),
    st.binary(max_size=40),
)
pamqp_tables = st.dictionaries(
    table_keys,
    st.recursive(
        pamqp_scalar_values,
        lambda children: (
            st.lists(children, max_size=4) | st.dictionaries(table_keys, children, max_size=4)
        ),
        max_leaves=12,
    ),
    max_size=6,
)


def to_pamqp(value: object) -> Any:
    """Our Python value -> the value pamqp uses for the same wire bytes."""
    if isinstance(value, Timestamp):
        return datetime.datetime.fromtimestamp(int(value), tz=datetime.UTC)
    if isinstance(value, bytes):
        return bytearray(value)
    if isinstance(value, dict):
        return {key: to_pamqp(item) for key, item in value.items()}
    if isinstance(value, list):
        return [to_pamqp(item) for item in value]
    return value


def typed(value: object) -> object:
    """A structure that compares types as well as values (Int8(1) != 1 here, and
    -0.0 != 0.0), for checking that a round trip preserves the Python types."""
    if isinstance(value, dict):
        return ("F", [(key, typed(item)) for key, item in value.items()])
    if isinstance(value, list):
        return ("A", [typed(item) for item in value])
    if isinstance(value, float):
        return (type(value), value.hex())
    if isinstance(value, Decimal):
        return (Decimal, value.as_tuple())
    return (type(value), value)


_KIND_STRATEGIES: dict[Kind, st.SearchStrategy[Any]] = {
    Kind.BIT: st.booleans(),
    Kind.OCTET: st.integers(0, 2**8 - 1),
    Kind.SHORT: st.integers(0, 2**16 - 1),
    Kind.LONG: st.integers(0, 2**32 - 1),
    Kind.LONGLONG: st.integers(0, 2**64 - 1),
    Kind.TIMESTAMP: st.integers(0, 2**64 - 1),
    Kind.SHORTSTR: shortstr_text,
    Kind.LONGSTR: st.binary(max_size=100),
    Kind.TABLE: field_tables,
}

_PAMQP_NAME = st.from_regex(r"[a-zA-Z0-9_.:@#,/+ -]{0,40}", fullmatch=True)
# Values pamqp's validate() insists on for reserved fields.
_PAMQP_FIXED: dict[str, object] = {
    "ticket": 0,
    "capabilities": "",
    "insist": False,
    "known_hosts": "",
    "out_of_band": "0",
    "channel_id": b"0",
    "cluster_id": "",
}


# pamqp reads a longlong as signed, so values from 2**63 up come back negative there.
_PAMQP_KIND_STRATEGIES = {
    **_KIND_STRATEGIES,
    Kind.LONGLONG: st.integers(0, 2**63 - 1),
    Kind.TABLE: pamqp_tables,
}


def methods_of(cls: type[Method], *, pamqp_decodable: bool = False) -> st.SearchStrategy[Method]:
    """Any instance of a method dataclass, every field drawn from its whole range (or,
    with `pamqp_decodable`, from the part of it pamqp decodes without loss)."""
    kinds = _PAMQP_KIND_STRATEGIES if pamqp_decodable else _KIND_STRATEGIES
    spec_fields: tuple[FieldSpec, ...] = cls.SPEC.fields
    return st.builds(cls, **{f.name: kinds[f.kind] for f in spec_fields})


def pamqp_methods_of(cls: type[Method]) -> st.SearchStrategy[Method]:
    """Instances that pamqp accepts: names in its regex, reserved fields as it wants them,
    longstrs that are UTF-8 text (pamqp encodes longstr from str only)."""
    strategies: dict[str, st.SearchStrategy[Any]] = {}
    for f in cls.SPEC.fields:
        if f.name in _PAMQP_FIXED:
            strategies[f.name] = st.just(_PAMQP_FIXED[f.name])
        elif f.domain in ("exchange-name", "queue-name"):
            strategies[f.name] = _PAMQP_NAME
        elif f.name == "virtual_host":
            strategies[f.name] = st.text(max_size=30)
        elif f.kind is Kind.LONGSTR:
            strategies[f.name] = st.text(max_size=40).map(str.encode)
        else:
            strategies[f.name] = _PAMQP_KIND_STRATEGIES[f.kind]
    return st.builds(cls, **strategies)


def pamqp_class(cls: type[Method]) -> Any:
    return pamqp_commands.INDEX_MAPPING[cls.CLASS_ID << 16 | cls.METHOD_ID]


def pamqp_name(name: str) -> str:
    return "exchange_type" if name == "type" else name


def pamqp_method(method: Method) -> Any:
    """The pamqp command object for one of our method dataclasses."""
    kwargs = {}
    for f in fields(method):  # every Method subclass is a dataclass
        value = getattr(method, f.name)
        if isinstance(value, bytes):
            value = value.decode()
        kwargs[pamqp_name(f.name)] = to_pamqp(value)
    return pamqp_class(type(method))(**kwargs)


def normalize_pamqp_field(value: object) -> object:
    """pamqp decodes a longstr to str when it is valid UTF-8; ours are bytes."""
    return value.encode() if isinstance(value, str) else value


def properties_of(
    strings: st.SearchStrategy[str | None],
    tables: st.SearchStrategy[Any],
    delivery_modes: st.SearchStrategy[int],
    timestamp_max: int,
    cluster_ids: st.SearchStrategy[str | None],
) -> st.SearchStrategy[BasicProperties]:
    return st.builds(
        BasicProperties,
        content_type=strings,
        content_encoding=strings,
        headers=st.none() | tables,
        delivery_mode=st.none() | delivery_modes,
        priority=st.none() | st.integers(0, 255),
        correlation_id=strings,
        reply_to=strings,
        expiration=strings,
        message_id=strings,
        timestamp=st.none() | st.integers(0, timestamp_max),
        type=strings,
        user_id=strings,
        app_id=strings,
        cluster_id=cluster_ids,
    )


_property_strings = st.none() | st.text(max_size=40)
basic_properties = properties_of(
    _property_strings, field_tables, st.integers(0, 255), 2**64 - 1, _property_strings
)
# What pamqp decodes without loss: its tables, timestamps it can turn into datetimes.
pamqp_decodable_properties = properties_of(
    _property_strings, pamqp_tables, st.integers(0, 255), 2**32 - 1, _property_strings
)
# What pamqp encodes: it drops empty strings, wants delivery_mode 1 or 2 and an empty
# cluster_id.
_pamqp_property_strings = st.none() | st.text(min_size=1, max_size=40)
pamqp_basic_properties = properties_of(
    _pamqp_property_strings, pamqp_tables, st.sampled_from([1, 2]), 2**32 - 1, st.none()
)


def pamqp_properties(properties: BasicProperties) -> Any:
    kwargs: dict[str, Any] = {}
    for f in fields(properties):
        value = getattr(properties, f.name)
        if value is None:
            continue
        if f.name == "timestamp":
            value = datetime.datetime.fromtimestamp(value, tz=datetime.UTC)
        kwargs["message_type" if f.name == "type" else f.name] = to_pamqp(value)
    return pamqp_commands.Basic.Properties(**kwargs)
