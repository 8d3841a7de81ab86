"""The codec against the real rstream client's own encoder and decoder (rstream 1.1).

What the gateway sends is decoded by rstream's `decode_frame` (which refuses trailing
bytes and any version but 1), and what rstream sends is decoded by ours, field by field:
the bytes the two sides agree on, without a socket.
"""

from __future__ import annotations

from rstream import schema
from rstream.constants import OffsetType as RstreamOffsetType
from rstream.encoding import decode_frame, encode_frame, encode_publish

from stream_gateway.codec import commands as c
from stream_gateway.codec import decode, encode
from stream_gateway.codec.constants import Key, OffsetType, ResponseCode

OK = ResponseCode.OK


def ours_to_theirs(command: c.Command) -> schema.Frame:
    return decode_frame(encode(command)[4:])


def theirs_to_ours(frame: schema.Frame) -> c.Command:
    return decode(encode_frame(frame)[4:])


def test_server_frames_decode_in_rstream() -> None:
    peer = ours_to_theirs(c.PeerPropertiesResponse(1, OK, {"product": "streamq"}))
    assert isinstance(peer, schema.PeerPropertiesResponse)
    assert [(p.key, p.value) for p in peer.properties] == [("product", "streamq")]
    sasl = ours_to_theirs(c.SaslHandshakeResponse(2, OK, ("PLAIN", "AMQPLAIN")))
    assert isinstance(sasl, schema.SaslHandshakeResponse) and sasl.mechanisms == [
        "PLAIN",
        "AMQPLAIN",
    ]
    assert ours_to_theirs(c.SaslAuthenticateResponse(3, 8)) == schema.SaslAuthenticateResponse(3, 8)
    assert ours_to_theirs(c.Tune(1 << 20, 60)) == schema.Tune(1 << 20, 60)
    opened = ours_to_theirs(c.OpenResponse(4, OK, {"advertised_host": "h", "advertised_port": "1"}))
    assert isinstance(opened, schema.OpenResponse) and len(opened.properties) == 2
    metadata = ours_to_theirs(
        c.MetadataResponse(5, (c.Broker(0, "h", 5552),), (c.StreamMetadata("s", OK, 0),))
    )
    assert isinstance(metadata, schema.MetadataResponse)
    assert metadata.metadata[0].name == "s" and metadata.metadata[0].leader_ref == 0
    confirm = ours_to_theirs(c.PublishConfirm(7, (1, 2)))
    assert confirm == schema.PublishConfirm(7, [1, 2])
    error = ours_to_theirs(c.PublishError(7, (c.PublishingError(3, 0x12),)))
    assert isinstance(error, schema.PublishError) and error.errors[0].response_code == 0x12
    update = ours_to_theirs(c.MetadataUpdate(6, "s"))
    assert isinstance(update, schema.MetadataUpdate) and update.metadata_info.stream == "s"
    consumer_update = ours_to_theirs(c.ConsumerUpdate(9, 1, True))
    assert consumer_update == schema.ConsumerUpdateResponse(9, 1, 1)
    routed = ours_to_theirs(c.RouteResponse(10, OK, ("p-1",)))
    assert isinstance(routed, schema.SuperStreamRouteResponse) and routed.streams == ["p-1"]
    versions = ours_to_theirs(
        c.ExchangeCommandVersionsResponse(
            11, OK, (c.CommandVersion(1, 1, 1), c.CommandVersion(2, 1, 2))
        )
    )
    assert isinstance(versions, schema.ExchangeCommandVersionResponse)
    assert versions.command_versions[Key.PUBLISH - 1].max_version == 2
    credit = ours_to_theirs(c.CreditResponse(ResponseCode.SUBSCRIPTION_ID_DOES_NOT_EXIST, 4))
    assert credit == schema.CreditResponse(4, 4)
    assert ours_to_theirs(c.Close(12, 1, "bye")) == schema.Close(12, 1, "bye")


def test_client_frames_decode_here() -> None:
    subscribe = schema.Subscribe(
        1, 2, "s", schema.OffsetSpec.from_params(RstreamOffsetType.OFFSET, 42), 10,
        [schema.Property("single-active-consumer", "true"), schema.Property("name", "g")],
    )  # fmt: skip
    assert theirs_to_ours(subscribe) == c.Subscribe(
        1, 2, "s", c.OffsetSpec(OffsetType.OFFSET, 42), 10,
        {"single-active-consumer": "true", "name": "g"},
    )  # fmt: skip
    # rstream sends its Tune reply with the request key; it decodes as our Tune.
    assert theirs_to_ours(schema.Tune(65536, 30)) == c.Tune(65536, 30)
    answer = schema.ConsumerUpdateServerResponse(5, 1, schema.OffsetSpecification(3, 0))
    assert theirs_to_ours(answer) == c.ConsumerUpdateResponse(
        5, 1, c.OffsetSpec(OffsetType.NEXT, 0)
    )
    create = schema.CreateSuperStream(6, "ss", ["ss-0"], ["0"], [schema.Property("max-age", "1h")])
    assert theirs_to_ours(create) == c.CreateSuperStream(
        6, "ss", ("ss-0",), ("0",), {"max-age": "1h"}
    )
    publish = schema.Publish(3, [schema.Message(7, "f", b"body")])
    decoded = decode(encode_publish(publish, 2)[4:])
    assert decoded == c.Publish(3, (c.PublishedMessage(7, b"body", "f"),), 2)
