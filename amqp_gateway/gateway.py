"""The AMQP side of a broker: what all its connections share.

Owns the `Gateway`: the set of open sessions, the read buffer they all parse in place,
the delivery drain (one callback per event-loop turn for every vhost's deliveries), the
housekeeping tick (journal flushes, segment collection, consumer timeouts, stream syncs),
resource alarms that block publishers, publisher flow control and the timer of delayed
messages. It must not touch sockets or listeners (amqp_gateway/listeners.py) nor handle
a connection's events (amqp_gateway/session.py): any transport that drives a session
made by `protocol_factory` is served the same way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Final

from amqp_gateway import routing
from amqp_gateway.channels import ChannelSession, Clock, monotonic_ms
from amqp_gateway.client_view import AmqpPropertiesJson
from amqp_gateway.deaths import AmqpPropertiesCodec
from amqp_gateway.direct import DirectConnector
from amqp_gateway.endpoints import Endpoints
from amqp_gateway.session import READ_BYTES_MAX, AmqpSession
from amqp_gateway.tuning import AmqpTuning
from streamq.broker.broker import Broker
from streamq.broker.queue import Queue
from streamq.broker.queue_arguments import CONSUMER_TIMEOUT_MS_DEFAULT
from streamq.broker.vhost import VHost
from streamq.log.errors import LogError, OutOfSpace
from streamq.log.scrub import SCRUB_BYTES_PER_TICK, Scrubber

logger = logging.getLogger(__name__)

SEGMENT_COLLECT_INTERVAL_S: Final = 5.0
# Acks and deliveries are recorded in queue journals; this often at the latest they are
# written and fsynced even when no publisher asks for a sync round.
JOURNAL_FLUSH_INTERVAL_S: Final = 0.2


class Gateway:
    """The AMQP side of a broker: its sessions and the delivery drain."""

    def __init__(
        self,
        broker: Broker,
        consumer_timeout_ms: int = CONSUMER_TIMEOUT_MS_DEFAULT,
        tuning: AmqpTuning = AmqpTuning(),  # noqa: B008  # frozen: one shared default is safe
    ) -> None:
        """Raises ValueError if `tuning` is out of range (AmqpTuning.check)."""
        tuning.check()
        self.broker = broker
        self.consumer_timeout_ms = consumer_timeout_ms
        self.tuning = tuning  # what each connection offers and enforces
        # Every connection reads into this and parses it before the next read: one
        # buffer for all (see `Connection.read_buffer`).
        self.read_buffer = bytearray(READ_BYTES_MAX + 2 * tuning.frame_max)
        self.clock = Clock()  # stamps deliveries: set per drain and per housekeeping tick
        self.sessions: set[AmqpSession] = set()
        self._to_flush: set[AmqpSession] = set()
        self._drain_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._housekeeping_task: asyncio.Task[None] | None = None
        self._scrubber = Scrubber()  # reads sealed segments to find bit rot early
        self._held_readers: list[AmqpSession] = []
        self.flow_held: set[AmqpSession] = set()  # publishers held by a queue in flow
        # Direct reply-to: reply consumers' channels by the suffix of their reply name.
        self.reply_channels: dict[str, ChannelSession] = {}
        # Delayed messages: one timer for the nearest deadline (epoch ms).
        self._release_timer: asyncio.TimerHandle | None = None
        self._release_deadline_ms = 0
        self.alarm = ""  # a resource alarm's reason while publishers are blocked
        self._space_listener: Callable[[], object] | None = None

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start serving on `loop`: once, whichever listener opens first."""
        if self._loop is not None:
            return
        self._loop = loop
        self.broker.properties_json = AmqpPropertiesJson()
        for vhost in self.broker.vhosts.values():
            self.attach_vhost(vhost)
        self.broker.vhost_listeners.append(self.attach_vhost)  # vhosts created at run time
        # A log that runs out of disk space blocks publishers at once, not at the next
        # tick: what they send meanwhile is held in memory until there is room.
        self._space_listener = lambda: loop.call_soon(self._check_resources)
        self.broker.syncer.space_listeners.append(self._space_listener)
        self._housekeeping_task = loop.create_task(self._housekeeping())

    def attach_vhost(self, vhost: VHost) -> None:
        vhost.wakeup = self.schedule_drain
        vhost.properties_codec = AmqpPropertiesCodec()
        vhost.on_delay = self._release_at
        vhost.decode_for_route = routing.fields_for_route
        deadline_ms = vhost.delayed.next_deadline_ms()
        if deadline_ms is not None:
            self._release_at(deadline_ms)  # delayed messages restored from disk

    def _release_at(self, deadline_ms: int) -> None:
        """Run `_release_delayed` at `deadline_ms` (epoch ms) unless a run is due sooner:
        one timer for the nearest deadline of all delayed messages."""
        loop = self._loop
        if loop is None:
            return
        if self._release_timer is not None:
            if self._release_deadline_ms <= deadline_ms:
                return
            self._release_timer.cancel()
        delay_s = max(0.0, deadline_ms / 1000 - time.time())
        self._release_deadline_ms = deadline_ms
        self._release_timer = loop.call_later(delay_s, self._release_delayed)

    def _release_delayed(self) -> None:
        """Route the delayed messages whose time has come; set the timer for the next."""
        self._release_timer = None
        now_ms = int(time.time() * 1000)
        nearest: int | None = None
        for vhost in self.broker.vhosts.values():
            try:
                if routing.release_delayed(vhost, now_ms):
                    self.schedule_drain()
            except LogError as exc:
                logger.error("vhost %s: delayed messages not routed: %s", vhost.name, exc)
            deadline_ms = vhost.delayed.next_deadline_ms()
            if deadline_ms is not None and (nearest is None or deadline_ms < nearest):
                nearest = deadline_ms
        if nearest is not None:
            self._release_at(max(nearest, now_ms + 1))

    async def _housekeeping(self) -> None:
        """Flush queue journals that no sync round has covered lately, drop log
        segments no queue needs (after a round, so that the acks that freed them are
        durable before the segments go), and scrub sealed segments for bit rot, a
        bounded part each tick (`streamq.log.scrub`)."""
        since_collect_s = 0.0
        while True:
            await asyncio.sleep(JOURNAL_FLUSH_INTERVAL_S)
            since_collect_s += JOURNAL_FLUSH_INTERVAL_S
            collect = since_collect_s >= SEGMENT_COLLECT_INTERVAL_S
            if collect:
                since_collect_s = 0.0
            self._check_resources()
            self.broker.stats_sampler.tick(self.broker.vhosts.values(), time.monotonic())
            now_ms = int(time.time() * 1000)
            self.clock.now_ms = monotonic_ms()
            self._check_consumer_timeouts()
            self._release_flow(self.clock.now_ms)
            for vhost in list(self.broker.vhosts.values()):
                # Each step gets a loop turn of its own, so that reads and deliveries run
                # in between: a whole pass in one go held every message that arrived
                # meanwhile for 0.4-0.8 ms, five times a second.
                await asyncio.sleep(0)
                if self.broker.vhosts.get(vhost.name) is not vhost:
                    continue  # deleted while an earlier one synced
                if vhost.schedule.read_held:  # reads that failed (EIO) are tried again
                    vhost.schedule.retry_reads(time.monotonic())
                if vhost.expire_heads(now_ms):
                    self.schedule_drain()
                vhost.expire_queues(time.monotonic())
                if vhost.streams_unsynced:
                    self._start_stream_syncs(vhost)
                await asyncio.sleep(0)
                if self.broker.vhosts.get(vhost.name) is not vhost:
                    continue
                try:
                    if vhost.log.out_of_space:
                        # Its writes wait for room, retried by the log itself; the acks
                        # may still be written, and free segments.
                        if collect:
                            await vhost.log.sync_companions()
                            vhost.collect_segments()
                    else:
                        if vhost.needs_sync() or collect:
                            await vhost.sync_all()
                        if collect:
                            vhost.collect_segments()
                except OutOfSpace:
                    pass  # the log said so once, and says so again when it has room
                except LogError as exc:
                    logger.error("vhost %s: housekeeping failed: %s", vhost.name, exc)
                if vhost.dead_letters.held and self.broker.vhosts.get(vhost.name) is vhost:
                    # At-least-once dead letters: released once their copies are durable
                    # (the round above), sent again when due.
                    vhost.dead_letters.tick(int(time.time() * 1000))
            await asyncio.sleep(0)
            logs = [v.log for v in self.broker.vhosts.values()]
            logs += [q.stream.log for v in self.broker.vhosts.values() for q in v.queues.values()
                     if q.stream is not None]  # fmt: skip
            self._scrubber.step(logs, SCRUB_BYTES_PER_TICK)

    def _check_consumer_timeouts(self) -> None:
        """RabbitMQ's consumer_timeout: close each channel whose oldest unacked delivery
        has outlived its timeout (one look per channel per tick, no timer per message)."""
        now_ms = self.clock.now_ms
        for session in list(self.sessions):
            for channel in list(session.channels.values()):
                timeout_ms = channel.timed_out(self.consumer_timeout_ms, now_ms)
                if timeout_ms is not None:
                    session.time_out(channel, timeout_ms)

    def _check_resources(self) -> None:
        """Block publishing connections while a resource alarm lasts (RabbitMQ: a
        connection that publishes is blocked; one that only consumes goes on, so that
        consumers can drain what fills memory)."""
        reason = self.broker.resources.check(log_out_of_space=bool(self.broker.syncer.out_of_space))
        if reason == self.alarm:
            return
        was_alarmed, self.alarm = bool(self.alarm), reason
        if reason and not was_alarmed:
            logger.warning("resource alarm: %s; blocking publishers", reason)
            for session in list(self.sessions):
                if session.has_published:
                    session.block(reason)
        elif not reason:
            logger.warning("resource alarm cleared; unblocking publishers")
            for session in list(self.sessions):
                session.unblock()

    def stop(self) -> None:
        if self._space_listener is not None:
            self.broker.syncer.space_listeners.remove(self._space_listener)
            self._space_listener = None
        if self._housekeeping_task is not None:
            self._housekeeping_task.cancel()
        if self._release_timer is not None:
            self._release_timer.cancel()
            self._release_timer = None

    def schedule_drain(self) -> None:
        if not self._drain_scheduled and self._loop is not None:
            self._drain_scheduled = True
            self._loop.call_soon(self._drain)

    def _drain(self) -> None:
        self._drain_scheduled = False
        self.clock.now_ms = monotonic_ms()  # the delivery time of this batch
        for vhost in self.broker.vhosts.values():
            if vhost.streams_unsynced:
                self._start_stream_syncs(vhost)
            if vhost.dirty:
                vhost.drain()
        self.flush_all()
        held, self._held_readers = self._held_readers, []
        for session in held:
            session.resume_after_drain()
        if self.flow_held:
            self._release_flow(self.clock.now_ms)

    def drain_early(self) -> None:
        """The deliveries of the pending drain, now, from within a connection's events (a
        piece of acks settled: `basic_methods.settle_ack_run`), and their writes. The drain stays
        scheduled for the rest of its work (held readers, flow, stream syncs)."""
        self.clock.now_ms = monotonic_ms()
        for vhost in self.broker.vhosts.values():
            if vhost.dirty:
                vhost.drain()
        self.flush_all()

    def _release_flow(self, now_ms: int) -> None:
        """Let publishers held by flow control read again once their queue left flow
        or FLOW_HOLD_MS_MAX passed."""
        for session in list(self.flow_held):
            if session.release_flow(now_ms):
                self.flow_held.discard(session)

    def _start_stream_syncs(self, vhost: VHost) -> None:
        """One sync round per stream with new appends, per loop turn at most: appends
        become readable once durable, and its waiting consumers are woken then."""
        assert self._loop is not None
        for queue in vhost.streams_to_sync():
            self._loop.create_task(self._sync_stream(vhost, queue))

    async def _sync_stream(self, vhost: VHost, queue: Queue) -> None:
        try:
            await vhost.sync_stream(queue)
        except LogError as exc:
            vhost.fail_queue(queue, f"its log failed: {exc}")
        self.schedule_drain()

    def hold_reading(self, session: AmqpSession) -> None:
        """Stop reading from `session` until the pending drain has run.

        The event loop may call `data_received` back to back for as long as a fast
        publisher keeps its socket readable; deliveries wait for the loop's next turn. A
        publisher that read a batch while deliveries are pending therefore waits for one
        drain: publishing and delivering alternate batch by batch.
        """
        self._held_readers.append(session)

    @property
    def drain_pending(self) -> bool:
        return self._drain_scheduled

    def want_flush(self, session: AmqpSession) -> None:
        self._to_flush.add(session)
        self.schedule_drain()

    def flush_all(self) -> None:
        sessions = self._to_flush
        self._to_flush = set()
        for session in sessions:
            session.flush()

    def close_all(self, reason: str) -> None:
        """Close every connection with 320 CONNECTION_FORCED (graceful shutdown)."""
        for session in list(self.sessions):
            session.force_close(reason)

    def protocol_factory(self, endpoints: Endpoints | None = None) -> AmqpSession:
        """A new session for a connection; `endpoints` if its listener knows them better
        than its socket (a PROXY header's, a unix socket's)."""
        return AmqpSession(self, endpoints)

    def direct_connector(self) -> DirectConnector:
        """Direct connections to this gateway for the broker's own links (shovels and
        federation on "amqp://" with no host): see amqp_gateway/direct.py."""
        return DirectConnector(self)
