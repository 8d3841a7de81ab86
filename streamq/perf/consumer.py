"""One consumer process: deliveries parsed in bulk from large reads, acked in batches.

Owns the consume loop: one `recv_into` per read, `scan_deliveries` over all of it, the
shared `-D` budget claimed per read, a basic.ack with `multiple` once `-a` messages are
unacked (with `--ack-each`, one basic.ack frame per message counted in the read, all in
one write), a tx.commit after `-T` acks (pipelined: deliveries keep flowing while one
commit is outstanding) and a sleep when ahead of the `-R` rate. Latency samples are its
result. It prints nothing.
"""

from __future__ import annotations

import time
from typing import Final

from amqp_gateway import codec
from amqp_gateway.codec import methods as m
from amqp_gateway.errors import ConnectionException
from streamq.perf.client import IO_TIMEOUT_S, AmqpClient
from streamq.perf.errors import PerfError
from streamq.perf.latency import LatencySamples
from streamq.perf.options import ThroughputConfig
from streamq.perf.shared import Shared
from streamq.perf.wire import CHANNEL, AckBatch, DeliveryScan, scan_deliveries, scan_frames
from streamq.perf.worker import wait_for_go

POLL_S: Final = 0.05
"""The longest read or sleep between two looks at the stop flag and the budget."""
CONSUMER_TAG: Final = "perf"
IDLE_TIMEOUT_S: Final = 30.0
"""With a `-D` budget, how long the consumers together may go without a delivery."""


def consume(config: ThroughputConfig, shared: Shared, index: int) -> bytes:
    """Connect, consume until stopped or the budget is spent, close; return the latency
    samples. Raises `PerfError`."""
    client = AmqpClient.connect(config.uri)
    try:
        if config.prefetch:
            client.call(m.BasicQos(prefetch_count=config.prefetch), m.BasicQosOk)
        if config.ack_tx:
            client.call(m.TxSelect(), m.TxSelectOk)
        wait_for_go(shared)
        subscribe = m.BasicConsume(
            queue=config.queue,
            consumer_tag=CONSUMER_TAG,
            no_ack=config.ack_every == 0,
            arguments=config.consumer_args,
        )
        client.call(subscribe, m.BasicConsumeOk)
        consumer = Consumer(client, config, shared, index)
        consumer.take(scan_frames(client.leftover_frames(), stamped=config.latency))
        consumer.run()
    finally:
        client.close()
    return consumer.latency.to_bytes()


class Consumer:
    def __init__(
        self, client: AmqpClient, config: ThroughputConfig, shared: Shared, index: int
    ) -> None:
        self.client = client
        self.config = config
        self.shared = shared
        self.index = index
        self.latency = LatencySamples()
        self.consumed = 0
        self.unacked = 0
        self.last_tag = 0
        self.ack_frames = 0
        self.ack_batch = AckBatch() if config.ack_each else None
        self.acked_in_tx = 0
        self.commit_pending = False
        self.started = time.monotonic()
        self.out = bytearray()
        self.idle_since = self.started
        self.claimed_seen = 0

    def run(self) -> None:
        sock = self.client.sock
        sock.settimeout(POLL_S)
        while not self.shared.stopping() and self.shared.consumes_left():
            if self.config.consume_rate and self.ahead_of_rate():
                continue
            try:
                self.client.buffer.fill(sock)
            except TimeoutError:
                self.check_idle()
                continue
            except OSError as exc:
                raise PerfError(f"connection lost: {exc.strerror or exc}") from None
            self.take(self.scan())
        self.finish()

    def check_idle(self) -> None:
        """Raise `PerfError` when a `-D` budget has seen no progress for a long time."""
        if not self.config.consume_max:
            return  # Without a budget, waiting for messages is what a consumer does.
        claimed = self.shared.consumes_claimed()
        now = time.monotonic()
        if claimed != self.claimed_seen:
            self.claimed_seen, self.idle_since = claimed, now
        elif now - self.idle_since > IDLE_TIMEOUT_S:
            budget = self.config.consume_max
            raise PerfError(
                f"no delivery in {IDLE_TIMEOUT_S:.0f} s, {claimed} of {budget} consumed"
            )

    def scan(self) -> DeliveryScan:
        try:
            return scan_deliveries(self.client.buffer, stamped=self.config.latency)
        except ConnectionException as exc:
            raise PerfError(f"bad frame from the broker: {exc}") from None

    def ahead_of_rate(self) -> bool:
        """Sleep (at most POLL_S) when ahead of `-R`; returns whether it slept."""
        ahead_s = self.consumed / self.config.consume_rate - (time.monotonic() - self.started)
        if ahead_s <= 0:
            return False
        time.sleep(min(POLL_S, ahead_s))
        return True

    def take(self, scan: DeliveryScan) -> None:
        """Count what one read brought, within the budget; ack and commit as due."""
        for frame in scan.others:
            self.on_method(self.client.method_of(frame))
        taken = self.shared.claim_consumes(scan.count) if scan.count else 0
        if not taken:
            return
        if self.config.ack_every and scan.last_tag - scan.first_tag + 1 != scan.count:
            # The acks are computed from counts: one consumer on one channel, whose
            # deliveries the broker numbers 1, 2, 3... (AMQP 0-9-1, basic.deliver).
            raise PerfError(f"delivery tags {scan.first_tag}..{scan.last_tag} skip some")
        self.consumed += taken
        if self.config.latency:
            self.latency.add(time.time_ns(), scan.stamps[:taken])
        self.last_tag = scan.first_tag + taken - 1
        self.unacked += taken
        if self.config.ack_every and self.unacked >= self.config.ack_every:
            self.ack()
        self.shared.set_consumed(self.index, self.consumed, self.ack_frames)

    def on_method(self, method: m.Method | None) -> None:
        if isinstance(method, m.TxCommitOk):
            self.commit_pending = False
        elif isinstance(method, m.BasicCancel):
            raise PerfError("the broker cancelled the consumer")

    def ack(self) -> None:
        """Ack everything counted so far, with one multiple ack or (`--ack-each`) one
        frame per message; commit when `-T` acks are in the transaction."""
        out = self.out
        if self.ack_batch is not None:
            self.ack_batch.append(out, self.last_tag - self.unacked + 1, self.unacked)
            self.ack_frames += self.unacked
        else:
            codec.append_basic_ack(out, CHANNEL, codec.DeliveryTag(self.last_tag), True)
            self.ack_frames += 1
        self.acked_in_tx += self.unacked
        self.unacked = 0
        commit_due = self.config.ack_tx and self.acked_in_tx >= self.config.ack_tx
        if commit_due and not self.commit_pending:
            codec.append_method_frame(out, CHANNEL, m.TxCommit())
            self.commit_pending = True
            self.acked_in_tx = 0
        self.client.send(out)
        out.clear()

    def finish(self) -> None:
        """Ack what was counted and wait for the last commit, so the broker's queue
        matches the counts; the rest of what is in flight is requeued on close."""
        if self.config.ack_every and self.unacked:
            self.ack()
        if self.config.ack_tx:
            deadline = time.monotonic() + IO_TIMEOUT_S
            while self.commit_pending or self.acked_in_tx:
                if not self.commit_pending:
                    self.client.send_method(m.TxCommit())
                    self.commit_pending = True
                    self.acked_in_tx = 0
                self.client.fill(deadline, "tx.commit-ok")
                self.take_final(self.scan())
        self.shared.set_consumed(self.index, self.consumed, self.ack_frames)

    def take_final(self, scan: DeliveryScan) -> None:
        """Past the budget: only look for commit-ok and closes, count nothing more."""
        for frame in scan.others:
            self.on_method(self.client.method_of(frame))
