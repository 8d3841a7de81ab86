"""The connection's transition table and refusal frames, without a socket.

Each command is legal only in the state the handshake says (RabbitMQ's reader closes
with UNKNOWN_FRAME otherwise), and each refused request has a response of its own
layout with the code: both come from stream_gateway/dispatch.py alone.
"""

from __future__ import annotations

import pytest

from stream_gateway import dispatch
from stream_gateway.codec import commands as c
from stream_gateway.codec import decode, encode
from stream_gateway.codec.constants import Key, OffsetType, ResponseCode
from stream_gateway.session import State

HANDSHAKE = [
    (c.PeerProperties(1, {}), State.PEER_PROPERTIES),
    (c.SaslHandshake(2), State.SASL_HANDSHAKE),
    (c.SaslAuthenticate(3, "PLAIN", b"\x00u\x00p"), State.SASL_AUTHENTICATE),
    (c.Tune(1 << 20, 60), State.TUNE),
    (c.Open(4, "/"), State.OPEN),
]
OPENED_ONLY = [
    c.Create(5, "s", {}),
    c.Subscribe(6, 1, "s", c.OffsetSpec(OffsetType.FIRST), 1),
    c.DeclarePublisher(7, 0, "", "s"),
    c.Credit(1, 1),
    c.StoreOffset("r", "s", 1),
    c.Route(8, "k", "ss"),
]


@pytest.mark.parametrize(("command", "legal"), HANDSHAKE)
def test_handshake_commands_are_legal_in_their_state_only(command: c.Command, legal: State) -> None:
    for state in State:
        allowed = dispatch.handler(state, command) is not None
        # A client that knows the mechanisms may authenticate without the handshake.
        skipped = isinstance(command, c.SaslAuthenticate) and state is State.SASL_HANDSHAKE
        assert allowed == (state is legal or skipped), (state, command)


@pytest.mark.parametrize("command", OPENED_ONLY)
def test_stream_commands_need_an_open_connection(command: c.Command) -> None:
    assert [s for s in State if dispatch.handler(s, command) is not None] == [State.OPENED]


def test_heartbeat_and_close_are_legal_anywhere() -> None:
    for state in State:
        assert dispatch.handler(state, c.Heartbeat()) is not None
        assert dispatch.handler(state, c.Close(1, 1, "bye")) is not None


def test_server_only_commands_are_never_legal_from_a_client() -> None:
    for command in (c.Deliver(1, b""), c.PublishConfirm(1, ()), c.MetadataUpdate(6, "s")):
        assert all(dispatch.handler(state, command) is None for state in State)


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (c.Create(1, "s", {}), c.Response(Key.CREATE, 1, ResponseCode.ACCESS_REFUSED)),
        (c.QueryOffset(2, "r", "s"), c.QueryOffsetResponse(2, ResponseCode.ACCESS_REFUSED, 0)),
        (c.Credit(3, 1), c.CreditResponse(ResponseCode.ACCESS_REFUSED, 3)),
        (c.Route(4, "k", "ss"), c.RouteResponse(4, ResponseCode.ACCESS_REFUSED, ())),
        (
            c.CreateSuperStream(5, "ss", ("p",), ("k",)),
            c.Response(Key.CREATE_SUPER_STREAM, 5, ResponseCode.ACCESS_REFUSED),
        ),
        (c.StoreOffset("r", "s", 1), None),
    ],
)
def test_refusals_have_each_responses_layout(
    command: c.Command, expected: c.Command | None
) -> None:
    refused = dispatch.refusal(command, ResponseCode.ACCESS_REFUSED)
    assert refused == expected
    if refused is not None:
        assert decode(encode(refused)[4:]) == refused
