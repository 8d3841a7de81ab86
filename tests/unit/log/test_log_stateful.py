"""A hypothesis state machine drives random appends, reads, seeks, syncs, reopens, crashes
(abandoning the log without a sync) and head drops against an in-memory model of the log,
with direct-I/O segment writes and with plain ones.

The model is the list of every record ever appended (offset = index) plus the first
retained offset. After a crash-reopen the log may keep any number of the unsynced records
that reached the OS, but never fewer than were durable and never different ones.
"""

from __future__ import annotations

import dataclasses
import itertools
import shutil
import tempfile

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from streamq.log import format as fmt
from streamq.log.errors import OffsetOutOfRange
from streamq.log.log import LogConfig, SegmentLog

CONFIG = LogConfig(segment_bytes_max=1024, index_interval_bytes=128, write_buffer_bytes_max=512)

bodies = st.binary(max_size=300)
batches = st.lists(
    st.builds(
        fmt.Message,
        st.sampled_from([b"", b"amq.topic"]),
        st.binary(max_size=8),
        st.just(b""),
        bodies,
    ),
    min_size=1,
    max_size=12,
)


class LogMachine(RuleBasedStateMachine):
    config = CONFIG  # segment writes with direct I/O: a crash leaves zero padding to cut

    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.mkdtemp(prefix="sq-stateful-")
        self.log = SegmentLog.open(self.directory, self.config)
        self.model: list[tuple[int, fmt.Message]] = []  # (timestamp_ms, message) by offset
        self.start = 0
        self.clock = 1000

    def teardown(self) -> None:
        self.log.close_blocking()
        shutil.rmtree(self.directory, ignore_errors=True)

    def expected(self, offset: int) -> fmt.Record:
        ts, m = self.model[offset]
        return fmt.Record(offset, ts, m.exchange, m.routing_key, m.properties, m.body)

    @rule(batch=batches, tick=st.integers(-5, 50))
    def append(self, batch: list[fmt.Message], tick: int) -> None:
        self.clock += tick
        first = self.log.append(batch, self.clock)
        assert first == len(self.model)
        ts = max([self.clock] + [t for t, _ in self.model[-1:]])
        self.model.extend((ts, m) for m in batch)

    @rule(batch=batches, tick=st.integers(-5, 50))
    def append_one_by_one(self, batch: list[fmt.Message], tick: int) -> None:
        """The publish path's single-message append must behave as a batch of one."""
        self.clock += tick
        for message in batch:
            offset = self.log.append_one(*message, self.clock)
            assert offset == len(self.model)
            ts = max([self.clock] + [t for t, _ in self.model[-1:]])
            self.model.append((ts, message))

    @rule()
    def sync(self) -> None:
        assert self.log.sync_blocking() == len(self.model)

    @rule(data=st.data(), records_max=st.integers(1, 40))
    def read(self, data: st.DataObject, records_max: int) -> None:
        durable = self.log.durable_next
        offset = data.draw(st.integers(self.start, max(self.start, durable + 2)))
        records = self.log.read(offset, records_max)
        want = list(range(offset, min(durable, offset + records_max)))
        assert [r.offset for r in records] == want
        assert records == [self.expected(o) for o in want]

    @precondition(lambda self: self.start > 0)
    @rule()
    def read_before_start_is_out_of_range(self) -> None:
        try:
            self.log.read(self.start - 1, 1)
        except OffsetOutOfRange as exc:
            assert exc.start_offset == self.start
        else:
            raise AssertionError("read before the start offset succeeded")

    @rule(data=st.data())
    def seek_timestamp(self, data: st.DataObject) -> None:
        durable = self.log.durable_next
        target = data.draw(st.integers(900, self.clock + 10))
        found = self.log.seek_timestamp(target)
        matches = [o for o in range(self.start, durable) if self.model[o][0] >= target]
        assert found == (matches[0] if matches else durable)

    @rule()
    def reopen(self) -> None:
        self.log.close_blocking()
        self.log = SegmentLog.open(self.directory, self.config)
        assert self.log.next_offset == self.log.durable_next == len(self.model)

    @rule()
    def crash(self) -> None:
        """Abandon the log without syncing: what reached the OS may survive, nothing less
        than what was durable may."""
        durable = self.log.durable_next
        self.log._release()  # drop the buffer and file descriptors, as a kill would
        self.log = SegmentLog.open(self.directory, self.config)
        survived = self.log.next_offset
        assert durable <= survived <= len(self.model)
        del self.model[survived:]
        assert self.log.read(self.start, 1 << 20) == [
            self.expected(o) for o in range(self.start, survived)
        ]

    @rule(data=st.data())
    def drop_head(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(0, len(self.model) + 5))
        before = self.log.segments()
        dropped = self.log.drop_segments_before(offset)
        after = self.log.segments()
        assert before[dropped:] == after
        assert all(s.next_offset <= offset and not s.active for s in before[:dropped])
        self.start = self.log.start_offset

    @invariant()
    def offsets_are_consistent(self) -> None:
        assert self.log.next_offset == len(self.model)
        assert self.start == self.log.start_offset <= self.log.durable_next <= self.log.next_offset
        infos = self.log.segments()
        assert infos[-1].active and infos[-1].next_offset == len(self.model)
        assert all(a.next_offset == b.base_offset for a, b in itertools.pairwise(infos))


class BufferedLogMachine(LogMachine):
    """The same with plain writes, as on a file system without direct I/O."""

    config = dataclasses.replace(CONFIG, direct_io=False)


LogMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
BufferedLogMachine.TestCase.settings = LogMachine.TestCase.settings
TestLogStateful = LogMachine.TestCase
TestBufferedLogStateful = BufferedLogMachine.TestCase
