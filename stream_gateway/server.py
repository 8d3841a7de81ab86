"""The stream side of a broker: what all its stream protocol connections share.

Owns the `StreamGateway`: its sessions, the publishers and subscriptions of every stream
(so that a stream's sync round confirms its publishers' frames and wakes its readers, and
its deletion sends MetadataUpdate to both), the publisher references in use, the single
active consumer groups, the advertised address, and opening the plain and TLS listeners.
The sync rounds themselves are started by the broker core's wake-up (the AMQP gateway's
drain), as for an AMQP publish; the gateway follows them through the vhost's
`stream_synced_listeners`. It must not parse frames (session.py and the codec do).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections import deque
from typing import Final, TypeVar

from stream_gateway import client_view, publishers, subscriptions
from stream_gateway.codec import commands as c
from stream_gateway.codec.constants import FRAME_MAX_DEFAULT, HEARTBEAT_S_DEFAULT, ResponseCode
from stream_gateway.publishers import PendingConfirm, Publisher
from stream_gateway.sac import SacGroups
from stream_gateway.session import StreamSession
from stream_gateway.subscriptions import Subscription
from streamq.broker.broker import Broker
from streamq.broker.queue import Queue
from streamq.broker.vhost import VHost
from streamq.log.errors import ReadFailed

logger = logging.getLogger(__name__)

STREAM_PORT_DEFAULT: Final = 5552
# Resource alarms (streamq.broker.resources) are looked at this often; while one lasts,
# connections with publishers are not read (RabbitMQ blocks stream publishers so), and
# connections that only consume go on, so that consumers can drain what fills memory.
ALARM_CHECK_INTERVAL_S: Final = 0.2
STREAMS_PORT_DEFAULT: Final = -1  # TLS: off unless set


class StreamGateway:
    """The stream protocol side of a broker."""

    def __init__(
        self,
        broker: Broker,
        *,
        frame_max: int = FRAME_MAX_DEFAULT,
        heartbeat_s: int = HEARTBEAT_S_DEFAULT,
        advertised_host: str = "",
        advertised_port: int = 0,
    ) -> None:
        self.broker = broker
        self.frame_max = frame_max
        self.heartbeat_s = heartbeat_s
        # One host for every client, whatever address it dialled: the host name by
        # default, as RabbitMQ (and as the management API names the node), so that a
        # client comparing Open's and Metadata's hosts (to find the leader) agrees.
        self.advertised_host = advertised_host or socket.gethostname()
        self.advertised_port = advertised_port  # 0: the port the client connected to
        self.sessions: set[StreamSession] = set()
        self.readers: dict[Queue, set[Subscription]] = {}
        self.writers: dict[Queue, set[tuple[StreamSession, int]]] = {}
        self.confirms: dict[Queue, dict[StreamSession, deque[PendingConfirm]]] = {}
        self.sac = SacGroups()
        # RabbitMQ's "last" offset specification starts at the last chunk: here, the
        # records of a stream's last sync round (a group commit is what an osiris chunk
        # is). Known from the second round this process saw; before, the last record.
        self._durable_seen: dict[Queue, int] = {}
        self._last_round_start: dict[Queue, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._again: set[Subscription] = set()  # drains cut at their per-turn limit
        self._again_scheduled = False
        self.alarm = ""  # a resource alarm's reason while publishers are blocked
        self._alarm_timer: asyncio.TimerHandle | None = None

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Follow every vhost's streams (once, whichever listener opens first)."""
        if self._loop is not None:
            return
        self._loop = loop
        for vhost in self.broker.vhosts.values():
            self.attach_vhost(vhost)
        self.broker.vhost_listeners.append(self.attach_vhost)
        self._alarm_timer = loop.call_later(ALARM_CHECK_INTERVAL_S, self._check_alarm)

    def attach_vhost(self, vhost: VHost) -> None:
        vhost.stream_synced_listeners.append(self.stream_synced)
        vhost.stream_removed_listeners.append(self.stream_removed)

    def protocol_factory(self) -> StreamSession:
        return StreamSession(self)

    def advertised(self, s: StreamSession) -> tuple[str, int]:
        """The host and port that Open and Metadata tell the client of `s`."""
        return self.advertised_host, self.advertised_port or s.port

    # -- publishers and confirms -----------------------------------------------------------

    def add_publisher(self, s: StreamSession, publisher: Publisher) -> None:
        self.writers.setdefault(publisher.queue, set()).add((s, publisher.publisher_id))

    def remove_publisher(self, s: StreamSession, publisher: Publisher) -> None:
        queue = publisher.queue
        _discard(self.writers, queue, (s, publisher.publisher_id))

    def pending_confirms(self, s: StreamSession, queue: Queue) -> deque[PendingConfirm]:
        by_session = self.confirms.get(queue)
        if by_session is None:
            by_session = self.confirms[queue] = {}
        pending = by_session.get(s)
        if pending is None:
            pending = by_session[s] = deque()
        return pending

    # -- subscriptions ---------------------------------------------------------------------

    def last_chunk_start(self, queue: Queue) -> int:
        """Where "last" starts on `queue`: its last sync round's first offset, or its last
        record when no round was seen yet (the durable end when empty)."""
        stream = queue.stream
        assert stream is not None
        log = stream.log
        last = log.durable_next - 1
        start = self._last_round_start.get(queue, last)
        if start > last or start < log.start_offset:
            start = last
        return max(start, log.start_offset)

    def add_reader(self, subscription: Subscription) -> None:
        self.readers.setdefault(subscription.queue, set()).add(subscription)

    def remove_reader(self, subscription: Subscription) -> None:
        _discard(self.readers, subscription.queue, subscription)
        self._again.discard(subscription)

    def drain_session(self, s: StreamSession) -> None:
        for subscription in list(s.subscriptions.values()):
            self.drain(subscription)
        s.flush()

    def drain(self, subscription: Subscription) -> None:
        """Deliver what the subscription may take now; a drain cut at its per-turn limit
        goes on one loop turn later. A read that fails with an I/O error (EIO) ends that
        subscription alone (`_read_failed`)."""
        try:
            more = subscriptions.drain(subscription)
        except ReadFailed as exc:
            self._read_failed(subscription, exc)
            return
        if more:
            self._again.add(subscription)
            if not self._again_scheduled and self._loop is not None:
                self._again_scheduled = True
                self._loop.call_soon(self._drain_again)

    def _read_failed(self, subscription: Subscription, exc: ReadFailed) -> None:
        """The subscription's read failed (EIO: the disk's fault, which may heal): it
        ends, and its connection gets MetadataUpdate(STREAM_NOT_AVAILABLE), the stream
        protocol's word for "subscribe again": clients do, from their last offset. The
        stream, its other readers and its publishers go on."""
        s = subscription.session
        logger.warning(
            "stream %r: subscription %d from offset %d ended: %s; the client is told the "
            "stream is unavailable (it subscribes again)",
            subscription.stream_name,
            subscription.subscription_id,
            subscription.offset,
            exc,
        )
        subscriptions.remove(subscription)
        s.send(c.MetadataUpdate(ResponseCode.STREAM_NOT_AVAILABLE, subscription.stream_name))
        s.flush()

    def _drain_again(self) -> None:
        """Drains that stopped at their per-turn limit go on, one turn later."""
        self._again_scheduled = False
        again, self._again = self._again, set()
        for subscription in again:
            self.drain(subscription)

    # -- the broker core's events ----------------------------------------------------------

    def stream_synced(self, queue: Queue) -> None:
        """A sync round of `queue` ended: confirm what it covers, wake its readers."""
        stream = queue.stream
        if stream is None:
            return
        durable_next = stream.log.durable_next
        seen = self._durable_seen.get(queue)
        if seen is not None and durable_next > seen:
            self._last_round_start[queue] = seen
        self._durable_seen[queue] = durable_next
        touched: set[StreamSession] = set()
        for s, pending in list(self.confirms.get(queue, {}).items()):
            if pending and publishers.send_confirms(s, queue, pending, durable_next):
                touched.add(s)
        for subscription in list(self.readers.get(queue, ())):
            self.drain(subscription)
        for s in touched:
            s.flush()

    def stream_removed(self, queue: Queue) -> None:
        """The stream is gone: its clients get MetadataUpdate(STREAM_NOT_AVAILABLE), as
        RabbitMQ sends, and lose their publishers and subscriptions on it."""
        notified: dict[StreamSession, str] = {}
        for subscription in list(self.readers.get(queue, ())):
            notified[subscription.session] = subscription.stream_name
            subscriptions.remove(subscription)
        for s, publisher_id in list(self.writers.get(queue, ())):
            publisher = s.publishers.pop(publisher_id, None)
            if publisher is not None:
                notified[s] = publisher.stream
                self.remove_publisher(s, publisher)
        self.readers.pop(queue, None)
        self.writers.pop(queue, None)
        self.confirms.pop(queue, None)
        self._durable_seen.pop(queue, None)
        self._last_round_start.pop(queue, None)
        for s, name in notified.items():
            s.send(c.MetadataUpdate(ResponseCode.STREAM_NOT_AVAILABLE, name))
            s.flush()

    # -- connections -----------------------------------------------------------------------

    def release(self, s: StreamSession) -> None:
        """Drop everything the connection held (it is closing or gone)."""
        for subscription in list(s.subscriptions.values()):
            subscriptions.remove(subscription)
        for publisher in list(s.publishers.values()):
            self.remove_publisher(s, publisher)
        s.publishers.clear()
        for by_session in self.confirms.values():
            by_session.pop(s, None)
        client_view.unregister(s)
        if s.vhost is not None:
            s.broker.tracking.remove(s, s.vhost.name, s.user)

    def forget(self, s: StreamSession) -> None:
        self.release(s)
        self.sessions.discard(s)

    def close_all(self, reason: str) -> None:
        if self._alarm_timer is not None:
            self._alarm_timer.cancel()
            self._alarm_timer = None
        for s in list(self.sessions):
            s.hang_up(reason)  # no Close frame, as a management close (and RabbitMQ 3.10)

    # -- resource alarms -------------------------------------------------------------------

    def _check_alarm(self) -> None:
        assert self._loop is not None
        self._alarm_timer = self._loop.call_later(ALARM_CHECK_INTERVAL_S, self._check_alarm)
        if not self.sessions:
            return
        broker = self.broker
        reason = broker.resources.check(log_out_of_space=bool(broker.syncer.out_of_space))
        if reason == self.alarm:
            return
        self.alarm = reason
        if reason:
            logger.warning("resource alarm: %s; blocking stream publishers", reason)
        else:
            logger.warning("resource alarm cleared; unblocking stream publishers")
        for s in list(self.sessions):
            s.hold_for_alarm(bool(reason) and bool(s.publishers))

    def blocks(self, s: StreamSession) -> bool:
        """Whether a connection that declares a publisher now must stop reading."""
        return bool(self.alarm)


K = TypeVar("K")
V = TypeVar("V")


def _discard(index: dict[K, set[V]], key: K, value: V) -> None:
    members = index.get(key)
    if members is not None:
        members.discard(value)
        if not members:
            del index[key]


async def start_stream_listener(
    gateway: StreamGateway, host: str, port: int, *, start_serving: bool = True
) -> asyncio.Server:
    """Listen for the stream protocol on host:port (TLS: streamq.app's `serve_tls` with
    `protocol_factory`, after `attach`); `start_serving` False: bound, accepting only
    after `start_serving()`. Raises OSError if it cannot bind."""
    loop = asyncio.get_running_loop()
    gateway.attach(loop)
    return await loop.create_server(
        gateway.protocol_factory, host, port, reuse_address=True, start_serving=start_serving
    )
