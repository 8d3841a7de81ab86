"""A consumer for driving a vhost directly, without the AMQP gateway: it implements the
broker's `Consumer` protocol by decoding the log records it is handed (with their CRCs
checked) and keeps what it received."""

from __future__ import annotations

from collections import deque

from streamq.broker.queue import Queue
from streamq.log import format as fmt
from streamq.queues.classic import ReadyMessage


class RecordingConsumer:
    """A consumer with a prefetch limit (0: none) that keeps what it was given."""

    def __init__(self, prefetch: int, tag: str = "t", no_ack: bool = False) -> None:
        self.tag = tag
        self.no_ack = no_ack
        self.exclusive = False
        self.priority = 0
        self.stream_position = 0
        self.stream_redeliver: deque[int] = deque()
        self.stream_tracker = None
        self.stream_window = None  # streams only: these tests drive classic queues
        self.stream_filtered = False
        self.prefetch = prefetch
        self.unacked: list[int] = []
        self.bodies: list[bytes] = []
        self.received: list[ReadyMessage] = []
        self.runs: list[int] = []  # how many messages each run delivery carried

    def accepts(self, properties_raw: bytes) -> bool:
        return True

    def can_take(self) -> bool:
        return self.credit() > 0

    def credit(self) -> int:
        if self.no_ack or self.prefetch == 0:
            return 1 << 30
        return self.prefetch - len(self.unacked)

    def deliver(self, queue: Queue, message: ReadyMessage, record: fmt.Record) -> None:
        if not self.no_ack:
            self.unacked.append(message.offset)
        self.bodies.append(record.body)
        self.received.append(message)

    def deliver_records(
        self,
        queue: Queue,
        records: bytes | bytearray | memoryview,
        position: int,
        first: int,
        count: int,
    ) -> tuple[int, int, int, list[int]]:
        data = bytes(records)
        out: list[fmt.Record] = []
        # The window starts at a record boundary at or before `first`: read from there,
        # whatever that record's offset (the decoder checks each CRC and the sequence).
        start_offset = int.from_bytes(data[position + 8 : position + 16], "little")
        result = fmt.decode_records(
            data, 0, position, start_offset, first + count, out, count, "test", first
        )
        for record in out:
            self.deliver(queue, ReadyMessage(record.offset, False, 0), record)
        if out:
            self.runs.append(len(out))
        next_offset = result.next_offset if result.position > position else -1
        return len(out), result.position, next_offset, [len(r.body) for r in out]

    def cancel_by_broker(self) -> None:
        raise AssertionError("not cancelled in these tests")
