"""One publisher process: pre-encoded publishes, written in large batches.

Owns the publish loop: size each batch by the confirm window (`-c`), the transaction
(`-t`), the rate limit (`-r`) and the shared `-C` budget; write it with one `sendall`;
then take whatever the broker sent (confirms, a channel.close) without waiting. At the
end it commits an open transaction and waits for outstanding confirms. Counts go to
`Shared` after every batch. It prints nothing.
"""

from __future__ import annotations

import time
from typing import Final

from amqp_gateway import codec
from amqp_gateway.codec import methods as m
from streamq.perf.client import IO_TIMEOUT_S, AmqpClient
from streamq.perf.errors import PerfError
from streamq.perf.options import ThroughputConfig
from streamq.perf.shared import Shared
from streamq.perf.wire import ConfirmTracker, PublishBatch
from streamq.perf.worker import wait_for_go

POLL_S: Final = 0.05
"""The longest sleep or read between two looks at the stop flag."""
PERSISTENT: Final = 2


def publish(config: ThroughputConfig, shared: Shared, index: int) -> bytes:
    """Connect, publish until stopped or the budget is spent, close. Raises `PerfError`."""
    client = AmqpClient.connect(config.uri)
    try:
        if config.publish_tx:
            client.call(m.TxSelect(), m.TxSelectOk)
        if config.confirm_max:
            client.call(m.ConfirmSelect(), m.ConfirmSelectOk)
        delivery_mode = PERSISTENT if config.persistent else None
        expiration = str(config.expiration_ms) if config.expiration_ms else None
        properties = codec.encode_properties(
            codec.BasicProperties(delivery_mode=delivery_mode, expiration=expiration)
        )
        batch = PublishBatch(
            config.exchange,
            config.routing_key,
            config.body_bytes,
            properties,
            client.frame_max,
            stamped=config.latency,
        )
        wait_for_go(shared)
        publisher = Publisher(client, batch, config, shared, index)
        publisher.run()
    except BaseException:
        client.close()
        raise
    if publisher.cut:
        client.abort()  # stopped in the middle of a batch the broker was not reading
    else:
        client.close()
    return b""


class Publisher:
    def __init__(
        self,
        client: AmqpClient,
        batch: PublishBatch,
        config: ThroughputConfig,
        shared: Shared,
        index: int,
    ) -> None:
        self.client = client
        self.batch = batch
        self.config = config
        self.shared = shared
        self.index = index
        self.confirms = ConfirmTracker()
        self.published = 0
        self.in_tx = 0
        self.started = time.monotonic()
        self.waiting_since = self.started
        self.cut = False  # stopped while the broker was not reading a batch

    def run(self) -> None:
        while not self.shared.stopping():
            count = self.room()
            if count == 0:
                self.wait_for_room()
                continue
            count = self.shared.claim_publishes(count)
            if count == 0:
                break
            if not self.client.send_batch(self.batch.take(count), self.shared.stopping):
                self.cut = True  # the batch is not counted: the broker got part of it
                self.report()
                return
            self.published += count
            self.in_tx += count
            if self.config.publish_tx and self.in_tx >= self.config.publish_tx:
                self.commit()
            self.take_incoming(0.0)
            self.waiting_since = time.monotonic()
            self.report()
        self.finish()

    def room(self) -> int:
        """How many publishes the next batch may hold now."""
        count = self.batch.count_max
        if self.config.confirm_max:
            count = min(count, self.config.confirm_max - self.unconfirmed())
        if self.config.publish_tx:
            count = min(count, self.config.publish_tx - self.in_tx)
        if self.config.publish_rate:
            due = int(self.config.publish_rate * (time.monotonic() - self.started))
            count = min(count, due - self.published)
        return max(0, count)

    def unconfirmed(self) -> int:
        return self.published - self.confirms.settled()

    def wait_for_room(self) -> None:
        if self.config.confirm_max and self.unconfirmed() >= self.config.confirm_max:
            if self.take_incoming(POLL_S):
                self.waiting_since = time.monotonic()
            elif time.monotonic() - self.waiting_since > IO_TIMEOUT_S:
                raise PerfError(f"no confirm from the broker in {IO_TIMEOUT_S:.0f} s")
            return
        # Rate limited: sleep until the next message is due, but look at stop often.
        due_s = (self.published + 1) / self.config.publish_rate
        time.sleep(min(POLL_S, max(0.0, due_s - (time.monotonic() - self.started))))

    def take_incoming(self, timeout_s: float) -> bool:
        """Read and handle what the broker sent, waiting up to `timeout_s` for it.
        Returns whether anything arrived. Raises `PerfError` on a close."""
        if not self.client.readable(timeout_s):
            return False
        self.client.fill(time.monotonic() + IO_TIMEOUT_S, "the broker")
        for frame in self.confirms.take_frames(self.client.split()):
            self.client.method_of(frame)
        return True

    def commit(self) -> None:
        self.client.call(m.TxCommit(), m.TxCommitOk)
        self.in_tx = 0

    def report(self) -> None:
        self.shared.set_published(self.index, self.published, self.confirms.settled())

    def finish(self) -> None:
        """Commit the open transaction and wait for the outstanding confirms."""
        if self.config.publish_tx and self.in_tx:
            self.commit()
        deadline = time.monotonic() + IO_TIMEOUT_S
        while self.config.confirm_max and self.unconfirmed() > 0:
            if time.monotonic() > deadline:
                raise PerfError(f"timed out waiting for {self.unconfirmed()} confirms")
            self.take_incoming(POLL_S)
            self.report()
        self.report()
