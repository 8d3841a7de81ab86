"""`streamq perf throughput --ack-each`: the per-message ack frames the consumer writes
(`wire.AckBatch`), how the sink settles them (`wire.scan_publishes`), and the flag's
checks. The frames are decoded by the project's codec and by pamqp, the test oracle."""

from __future__ import annotations

import argparse

import pytest
from pamqp import commands as pamqp_commands
from pamqp import frame as pamqp_frame

from amqp_gateway import codec
from amqp_gateway.codec import methods as m
from streamq.perf.errors import PerfError
from streamq.perf.options import add_subcommands, throughput_config
from streamq.perf.wire import ACK_RUN_COUNT_MAX, AckBatch, RecvBuffer, scan_publishes

FRAME_MAX = 131072


def acks(first_tag: int, count: int) -> bytearray:
    out = bytearray(b"already there")
    AckBatch().append(out, first_tag, count)
    assert out.startswith(b"already there")
    return out[len(b"already there") :]


def decoded(data: bytes) -> list[m.Method]:
    frames, used = codec.split_frames(memoryview(data), FRAME_MAX)
    assert used == len(data)
    assert all(frame.channel == 1 for frame in frames)
    return [codec.decode_method(frame.payload) for frame in frames]


@pytest.mark.parametrize(
    ("first_tag", "count"),
    [(1, 1), (1, 1000), (7, ACK_RUN_COUNT_MAX + 3), ((1 << 40) - 2, 5), ((1 << 64) - 3, 3)],
)
def test_one_ack_frame_per_tag_without_multiple(first_tag: int, count: int) -> None:
    methods = decoded(acks(first_tag, count))
    assert methods == [m.BasicAck(delivery_tag=tag, multiple=False) for tag in
                       range(first_tag, first_tag + count)]  # fmt: skip


def test_pamqp_reads_the_same_frames() -> None:
    data = bytes(acks(300, 3))
    tags = []
    while data:
        used, channel, method = pamqp_frame.unmarshal(data)
        assert channel == 1
        assert isinstance(method, pamqp_commands.Basic.Ack)
        assert method.multiple is False
        tags.append(method.delivery_tag)
        data = data[used:]
    assert tags == [300, 301, 302]


def test_no_acks_append_nothing() -> None:
    assert acks(5, 0) == b""


def test_the_sink_settles_a_read_of_acks_by_its_highest_tag() -> None:
    buffer = RecvBuffer(FRAME_MAX)
    data = acks(1, 50)
    codec.append_basic_ack(data, codec.ChannelId(1), codec.DeliveryTag(10), True)
    codec.append_basic_ack(data, codec.ChannelId(3), codec.DeliveryTag(4), True)
    data += codec.encode_method_frame(codec.ChannelId(2), m.BasicQos(prefetch_count=5))
    buffer.data[: len(data)] = data
    buffer.end = len(data)
    scan = scan_publishes(buffer)
    assert scan.acked_upto == {1: 50, 3: 4}
    assert [codec.decode_method(frame.payload) for frame in scan.others] == [
        m.BasicQos(prefetch_count=5)
    ]
    assert buffer.pending() == 0


def parse(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_subcommands(parser)
    return parser.parse_args(["throughput", *flags])


def test_ack_each_acks_every_read() -> None:
    config = throughput_config(parse("--ack-each", "-P", "1000"))
    assert (config.ack_each, config.ack_every) == (True, 1)
    config = throughput_config(parse("--ack-each", "-T", "100", "-P", "1000"))
    assert (config.ack_each, config.ack_every, config.ack_tx) == (True, 1, 100)
    assert throughput_config(parse("-a", "10")).ack_each is False


def test_ack_each_and_ack_every_n_are_exclusive() -> None:
    with pytest.raises(PerfError, match="--ack-each and -a cannot be combined"):
        throughput_config(parse("--ack-each", "-a", "10"))
