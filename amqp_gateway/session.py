"""The AMQP session: one client connection, from bytes read to broker calls.

Owns `AmqpSession`, the asyncio BufferedProtocol of one connection. It feeds what the
transport reads to the sans-IO `Connection`, turns its events into broker-core calls
(login, open and permissions through `access`, methods through `channel_methods`,
publishes and confirms through `publishing`), writes the outgoing buffer once per read
and once per delivery batch, pauses reading while a reply waits for a sync round, a
drain, a resource alarm or publisher flow control, and runs heartbeats and the handshake
timeout.

It needs only the subset of asyncio.Transport it calls (write, close, abort, is_closing,
pause_reading, resume_reading, set_write_buffer_limits, get_extra_info): a TCP socket, a
unix socket, asyncio's TLS transport and a WebSocket adapter all run this same code. It
must not open listeners or sockets itself (amqp_gateway/listeners.py) nor own what every
connection shares (amqp_gateway/gateway.py). The fast path stays here: reads land in the
gateway's shared buffer and are parsed in place, runs of publishes and acks are one event
each, and there is no task per message.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, cast

from amqp_gateway import access, basic_methods, channel_methods, errors, publishing
from amqp_gateway.access import Permissions
from amqp_gateway.channels import ChannelSession, monotonic_ms
from amqp_gateway.client_view import AmqpClient
from amqp_gateway.codec import methods as m
from amqp_gateway.connection import Connection
from amqp_gateway.endpoints import Endpoints, connection_name, socket_endpoints
from amqp_gateway.errormap import to_amqp
from amqp_gateway.events import (
    AckRun,
    ChannelClosed,
    ConnectionClosed,
    Event,
    LoginRequested,
    MethodReceived,
    OpenRequested,
    Publish,
    PublishRun,
    slice_end,
)
from amqp_gateway.external_auth import offered_mechanisms
from amqp_gateway.states import State
from streamq.broker.accounts import PermissionKind
from streamq.broker.errors import BrokerError
from streamq.broker.queue import Queue
from streamq.broker.vhost import VHost
from streamq.log.errors import LogError
from streamq.log_fields import CHANNEL, CONNECTION, FieldsLogger

if TYPE_CHECKING:
    from amqp_gateway.gateway import Gateway

logger = logging.getLogger(__name__)

CLOSE_TIMEOUT_S: Final = 10.0  # wait this long for close-ok before dropping the socket
# After our close-ok, the socket stays open (reading and discarding) until the client
# hangs up, at most this long: closing at once reset the connection under a client that
# still had publishes queued behind its close (EPIPE/ECONNRESET, its close() never
# returned). RabbitMQ's reader waits up to its heartbeat timeout, 30 s at most.
CLOSED_LINGER_S: Final = 5.0
WRITE_BUFFER_HIGH_BYTES: Final = 4 * 1024 * 1024  # deliveries pause above this
# A read from a socket takes at most this much; the shared read buffer also holds a
# connection's partial frame in front of it. uvloop's own reads were 256 KiB: 1 MiB cut
# the event loop's time per 64 KiB publish from about 62 to 45 us (fewer reads, window
# updates and runs).
READ_BYTES_MAX: Final = 1024 * 1024
HANDSHAKE_TIMEOUT_S: Final = 10.0  # RabbitMQ's handshake_timeout: open within this
HEARTBEAT_CHECK_FIRST_S: Final = 0.5  # the first check follows the handshake closely
HEARTBEAT_IDLE_CHECK_S: Final = 5.0  # heartbeats off: look again later (they may be tuned)
# Publisher flow control: a connection that published to a queue in flow (see
# VHost._drain_queue) stops reading until the queue leaves flow, or for this long at most
# (checked after each drain and each housekeeping tick): a consumer that never acks slows
# publishers to a read per hold, it does not stop them.
FLOW_HOLD_MS_MAX: Final = 100
# A publisher held by flow control reads this much at most until its queue leaves flow:
# one read per hold lets in a few dozen 1 KiB messages, not a thousand.
FLOW_READ_BYTES_MAX: Final = 64 * 1024


class AmqpSession(asyncio.BufferedProtocol):
    """One client connection. Reads land in the gateway's read buffer, shared by every
    connection, and are parsed there (`Connection.read_buffer`): no bytes object per read
    and no copy of it into a buffer of the connection's, which cost a 256 KiB allocation
    and copy per read (about one copy of every published body)."""

    def __init__(self, gateway: Gateway, endpoints: Endpoints | None = None) -> None:
        self.gateway = gateway
        self.broker = gateway.broker
        self.conn = Connection(
            access.server_properties(gateway.broker), time.monotonic(), gateway.tuning
        )
        self.channels: dict[int, ChannelSession] = {}
        self.vhost: VHost | None = None
        self.paused = False
        self.clock = gateway.clock
        self.unflushed = 0  # deliveries framed since the last write (channels.piece_of)
        self.acks_since_drain = 0  # plain acks settled since deliveries last had a turn
        # Given by the listener (a PROXY header's, a unix socket's), else read off the
        # socket at connection_made; None for a socket that is not IP nor unix.
        self.endpoints = endpoints
        self.peer = "?"
        # This connection's lines carry its name, then its user and vhost (access.py).
        self.log = FieldsLogger(logger)
        self.opened = False  # connection.open accepted; its close is logged (access.py)
        self._transport: asyncio.Transport | None = None
        self._heartbeat: asyncio.TimerHandle | None = None
        self.confirming = False  # publishing.confirm_loop runs (one task at most)
        self._closing_timer: asyncio.TimerHandle | None = None
        self._linger_timer: asyncio.TimerHandle | None = None  # see CLOSED_LINGER_S
        self._connected_s = time.monotonic()
        self.connected_at_ms = int(time.time() * 1000)
        self.recv_oct = 0  # bytes read and written, for the management API
        self.send_oct = 0
        self.client: AmqpClient | None = None  # registered in Broker.clients once open
        # A reply that must wait for a sync round (Declare-Ok of a durable entity,
        # Commit-Ok); while one waits, reading stops and later events are held, so that
        # replies keep their order.
        self._waiting: tuple[int, m.Method | None] | None = None
        self._after_reply: Callable[[], None] | None = None  # runs once it is sent
        self._held: list[Event] = []
        self._published = False  # since reading was last held for a drain
        self.has_published = False  # ever: a resource alarm blocks publishers only
        self._blocked_sent = False  # connection.blocked went out, unblocked not yet
        # Why reading from the socket is paused: "sync" (a reply waits for a sync round),
        # "drain" (a publisher waits for one delivery drain), "alarm" (a resource alarm
        # blocks publishers), "flow" (it published to a queue in flow). Reading resumes
        # when the set is empty.
        self._holds: set[str] = set()
        # "flow": published to this queue while it was in flow (publisher flow control).
        self.flow_queue: Queue | None = None
        self._flow_since_ms = 0
        self._read_max = READ_BYTES_MAX  # FLOW_READ_BYTES_MAX while its queue is in flow
        # Whether the last read filled its buffer: only then may the socket hold more, and
        # the event loop read it again before the drain (see `_run`).
        self._read_full = True
        self.now_ms = 0
        self.auth_mechanism = ""  # SASL's, at login
        self.user = ""  # set at login, with the vhost and permissions at open (access.py)
        self.impersonator = False
        self.permissions: Permissions | None = None
        # A direct connection (amqp_gateway/direct.py) logs in as this user, unchecked.
        self.direct_user: str | None = None
        self.internal = False  # logged in as the internal user (access.py)

    # -- socket events ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        self._transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH_BYTES)
        if self.endpoints is None:
            self.endpoints = socket_endpoints(transport)
        if self.endpoints is not None:
            self.peer = self.endpoints.peer
        else:
            self.peer = str(transport.get_extra_info("peername"))
        self.log.fields[CONNECTION] = connection_name(self.endpoints, self.peer)
        self.conn.mechanisms = offered_mechanisms(transport)
        self.gateway.sessions.add(self)
        self._schedule_heartbeat(HEARTBEAT_CHECK_FIRST_S)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.conn.read_buffer(self.gateway.read_buffer, self._read_max)

    def buffer_updated(self, nbytes: int) -> None:
        self.now_ms = int(time.time() * 1000)  # the append timestamp of this read
        self.acks_since_drain = 0
        self._read_full = nbytes >= self._read_max
        self.recv_oct += nbytes
        events = self.conn.receive_read(nbytes, time.monotonic())
        if self._waiting is not None or self._held:
            self._held.extend(events)  # behind a reply that waits, or a slice in progress
            return
        self._run(events)

    def _run(self, events: list[Event]) -> None:
        """Handle events, at most `events.EVENTS_PER_SLICE` of them while deliveries are pending:
        the rest wait, reading stops, and the next slice runs after the drain. A read of
        a fast publisher holds thousands of messages; without slices consumers would get
        one turn per read, and their acks would wait behind it."""
        while True:
            if len(events) > 1 and self.gateway.drain_pending:
                cut = slice_end(events)
                if cut < len(events):
                    events, self._held = events[:cut], events[cut:]
            self.handle_events(events)
            if self._held or self._waiting is not None or not self.conn.parse_paused:
                break
            # Every event of the read is handled: the protocol goes on from the frame it
            # answers itself, which it stopped before (connection.py, rule 3).
            events = self.conn.resume_parse()
        self.flush()
        published, self._published = self._published, False
        if published:
            self.has_published = True
            if self.gateway.alarm:
                self.block(self.gateway.alarm)
        if self.flow_queue is not None and "flow" not in self._holds:
            self._hold("flow")
            self._read_max = FLOW_READ_BYTES_MAX
            self._flow_since_ms = monotonic_ms()
            self.gateway.flow_held.add(self)
        if self._waiting is not None or (self.gateway.alarm and published):
            return  # held by the sync round or the alarm; they resume it
        # A publisher waits for the drain only when its socket may hold more: the event
        # loop reads a socket again at once only after a read that filled its buffer
        # (libuv stops at a short read; asyncio reads once per readiness), and the drain
        # runs before the next poll. Pausing after every short read cost two syscalls per
        # read (the reading stopped and started again) at low rates.
        wait = self._held or (published and self._read_full and self.gateway.drain_pending)
        if wait and "drain" not in self._holds:
            self._hold("drain")
            self.gateway.hold_reading(self)
            self.gateway.schedule_drain()

    def resume_after_drain(self) -> None:
        """The drain ran: take the next slice of held events, else read again."""
        self._holds.discard("drain")
        if self._held and self._waiting is None and self.conn.state is not State.CLOSED:
            held, self._held = self._held, []
            self._run(held)  # may hold "drain" again for the next slice
        if not self._holds:
            self._read_again()

    def release_flow(self, now_ms: int) -> bool:
        """Read again if the queue that held this publisher left flow or the hold has
        lasted FLOW_HOLD_MS_MAX; True once released."""
        queue = self.flow_queue
        if queue is not None and queue.in_flow:
            if now_ms - self._flow_since_ms < FLOW_HOLD_MS_MAX:
                return False
        else:
            self._read_max = READ_BYTES_MAX  # its queue left flow: full reads again
        self.flow_queue = None
        self._unhold("flow")
        return True

    def _hold(self, reason: str) -> None:
        transport = self._transport
        if not self._holds and transport is not None and not transport.is_closing():
            transport.pause_reading()
        self._holds.add(reason)

    def _unhold(self, reason: str) -> None:
        if reason in self._holds:
            self._holds.discard(reason)
            if not self._holds:
                self._read_again()

    def _read_again(self) -> None:
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.resume_reading()

    def block(self, reason: str) -> None:
        """A resource alarm: stop reading from this publisher and tell it why, if its
        client understands connection.blocked (as RabbitMQ)."""
        if (
            not self._blocked_sent
            and self.conn.state is State.OPEN
            and self.conn.announces("connection.blocked")
        ):
            self.conn.send_method(0, m.ConnectionBlocked(reason=reason))
            self._blocked_sent = True
            self.flush()
        self._hold("alarm")

    def unblock(self) -> None:
        if self._blocked_sent and self.conn.state is State.OPEN:
            self.conn.send_method(0, m.ConnectionUnblocked())
            self.flush()
        self._blocked_sent = False
        self._unhold("alarm")
        if self._held and self._waiting is None and "drain" not in self._holds:
            held, self._held = self._held, []
            self._run(held)  # what was read before the block

    @property
    def blocked_by_alarm(self) -> bool:
        return "alarm" in self._holds

    @property
    def state(self) -> str:
        """RabbitMQ's connection state (`streamq.broker.clients.Client.state`)."""
        if self.conn.state >= State.CLOSING:
            return "closing"
        if "alarm" in self._holds:
            return "blocked"
        if self.gateway.alarm:
            return "blocking"  # not read once it publishes (`block`)
        return "flow" if "flow" in self._holds else "running"

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.vhost is not None:
            for channel in self.channels.values():
                channel.unblock_consumers()
                for consumer in channel.consumers.values():
                    self.vhost.kick(consumer.queue)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
        # Gone: what is framed later (a confirm round that ends now) is dropped, never
        # written to the closed transport (uvloop raises there).
        self._transport = None
        self._cleanup()

    def note_output(self) -> None:
        self.gateway.want_flush(self)

    def force_close(self, reason: str, wait_close_ok: bool = False) -> None:
        """Close with 320 CONNECTION_FORCED. With `wait_close_ok` (the management API's
        close, as RabbitMQ's) the socket stays open, discarding what comes, until the
        client's close-ok or CLOSE_TIMEOUT_S; else (shutdown) it closes at once."""
        events: list[Event] = []
        self.conn.close(320, f"CONNECTION_FORCED - {reason}", 0, 0, events)
        if wait_close_ok and self.conn.state is State.CLOSING:
            self._start_closing_timer()
        self.handle_events(events)
        self.flush()
        if self._transport is not None and not wait_close_ok:
            self._transport.close()

    def flush(self) -> None:
        transport = self._transport
        if transport is None:
            return
        self.unflushed = 0
        data = self.conn.take_outgoing(time.monotonic())
        if data:
            self.send_oct += len(data)
            transport.write(data)
        if self.conn.state is State.CLOSED:
            if self.conn.close_ok_sent:
                self._linger(transport)
            else:
                transport.close()

    def _linger(self, transport: asyncio.Transport) -> None:
        """Keep reading (the protocol discards it) until the client hangs up (asyncio
        closes the transport at its EOF) or CLOSED_LINGER_S passes."""
        if self._linger_timer is not None or transport.is_closing():
            return
        if self._holds:
            self._holds.clear()
            transport.resume_reading()
        loop = asyncio.get_running_loop()
        self._linger_timer = loop.call_later(CLOSED_LINGER_S, transport.close)

    # -- events ----------------------------------------------------------------------------

    def handle_events(self, events: list[Event]) -> None:
        confirm_needed = False
        for index, event in enumerate(events):
            if self._waiting is not None:
                self._held.extend(events[index:])
                break
            try:
                if type(event) is PublishRun:
                    self._published = True
                    confirm_needed |= publishing.publish_run(self, event)
                elif type(event) is Publish:
                    self._published = True
                    confirm_needed |= publishing.publish(self, event)
                elif type(event) is AckRun:
                    basic_methods.settle_ack_run(self, event)
                elif isinstance(event, MethodReceived):
                    # An error earlier in this read may have closed the channel after the
                    # protocol parsed this method: discard it (connection.py, rule 2).
                    if not self.conn.is_channel_closing(event.channel):
                        channel_methods.receive_method(self, event.channel, event.method)
                elif isinstance(event, ChannelClosed):
                    channel_methods.channel_closed(self, event.channel)
                elif isinstance(event, LoginRequested):
                    access.login(self, event)
                elif isinstance(event, OpenRequested):
                    access.open_vhost(self, event.virtual_host)
                elif isinstance(event, ConnectionClosed):
                    self._cleanup()
            except errors.AMQPError as exc:
                self.fail(exc, getattr(event, "channel", 0))
            except (BrokerError, LogError) as exc:
                self.fail(to_amqp(exc, 0, 0), getattr(event, "channel", 0))
            except Exception as exc:  # a bug in a handler: 541 for this connection only
                self.log.exception("internal error on connection %s", self.peer)
                self.fail(errors.InternalError(f"internal error: {exc}"), 0)
        if confirm_needed and not self.confirming:
            self.confirming = True
            asyncio.get_running_loop().create_task(publishing.confirm_loop(self))

    def reply_durable(
        self,
        channel_id: int,
        method: m.Method | None,
        *,
        always: bool,
        then: Callable[[], None] | None = None,
    ) -> None:
        """Send `method` once every change so far is durable: at once if nothing is
        pending (and not `always`), else after a sync round, holding later events.
        `then` runs right after the reply is sent (or the connection failed instead),
        before any held event: what it sends follows the reply."""
        vhost = self.current_vhost()
        if not always and not vhost.needs_sync():
            if method is not None:
                self.conn.send_method(channel_id, method)
            if then is not None:
                then()
            return
        self._waiting = (channel_id, method)
        self._after_reply = then
        self._hold("sync")
        asyncio.get_running_loop().create_task(self._reply_after_sync(vhost))

    async def _reply_after_sync(self, vhost: VHost) -> None:
        assert self._waiting is not None
        channel_id, method = self._waiting
        try:
            await vhost.sync_all()
        except LogError as exc:
            self.log.error("message store failed; closing connection %s: %s", self.peer, exc)
            self._waiting = None
            ids = (0, 0) if method is None else (method.CLASS_ID, method.METHOD_ID)
            self.fail(to_amqp(exc, *ids), 0)
        else:
            self._waiting = None
            if method is not None and self.conn.is_channel_open(channel_id):
                self.conn.send_method(channel_id, method)
        then, self._after_reply = self._after_reply, None
        if then is not None:
            then()
        held, self._held = self._held, []
        if self.conn.state is not State.CLOSED:
            self._run(held)
        self.flush()
        if self._waiting is None:
            self._unhold("sync")

    def fail(self, exc: errors.AMQPError, channel: int) -> None:
        session = self.channels.get(channel) if channel else None
        if (
            isinstance(exc, errors.ChannelException)
            and session is not None
            and session.confirm
            and session.publish_seq > session.confirmed_seq
            and self._waiting is None
            and self.conn.is_channel_open(channel)
        ):
            self._fail_after_confirms(exc, session)
            return
        self._fail_now(exc, channel)

    def _fail_after_confirms(self, exc: errors.AMQPError, session: ChannelSession) -> None:
        """A channel error on a channel that owes confirms: the publishes it stored before
        the error are confirmed first (after the sync that makes them durable), then the
        channel closes, as RabbitMQ's client sees it. Closing first lost those confirms
        whenever the client's close-ok came before the sync, and a client republishes
        what it never saw confirmed. Later events wait behind the sync."""
        seq = session.publish_seq

        def close() -> None:
            owed = self.channels.get(session.id) is session and seq > session.confirmed_seq
            if owed and self.conn.state is State.OPEN:
                publishing.confirm(self, session, seq)
            self._fail_now(exc, session.id)

        self.reply_durable(session.id, None, always=True, then=close)

    def _fail_now(self, exc: errors.AMQPError, channel: int) -> None:
        events: list[Event] = []
        self.conn.fail(exc, channel, events)
        if self.conn.state is State.CLOSING:
            self._start_closing_timer()
        self.handle_events(events)

    def _start_closing_timer(self) -> None:
        if self._closing_timer is None:
            loop = asyncio.get_running_loop()
            self._closing_timer = loop.call_later(CLOSE_TIMEOUT_S, self._abort)

    def _abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    @property
    def transport(self) -> asyncio.Transport | None:
        return self._transport

    def check_access(
        self, kind: PermissionKind, resource: str, name: str, ids: tuple[int, int]
    ) -> None:
        """RabbitMQ's resource permissions: 403 unless the user's `kind` regex allows it."""
        permissions = self.permissions
        assert permissions is not None  # methods come only once the connection is open
        permissions.check(kind, resource, name, ids)

    def channel(self, channel_id: int) -> ChannelSession:
        channel = self.channels.get(channel_id)
        if channel is None:
            channel = self.channels[channel_id] = ChannelSession(channel_id, self.conn, self)
        return channel

    def time_out(self, channel: ChannelSession, timeout_ms: int) -> None:
        """A delivery on `channel` stayed unacked past the consumer timeout: close the
        channel with 406 in RabbitMQ's words, and requeue its unacked deliveries now,
        rather than when close-ok comes (RabbitMQ's channel ends at once)."""
        self.log.warning(
            "consumer timeout on channel %d of %s (%d ms)",
            channel.id,
            self.peer,
            timeout_ms,
            extra={CHANNEL: channel.id},
        )
        text = (
            f"delivery acknowledgement on channel {channel.id} timed out. Timeout value used: "
            f"{timeout_ms} ms. This timeout value can be configured, see consumers doc guide "
            "to learn more"
        )
        self.fail(errors.PreconditionFailed(text, 0, 0), channel.id)
        channel_methods.release_channel(self, channel)
        self.flush()

    def _cleanup(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            self._heartbeat = None
        if self._closing_timer is not None:
            self._closing_timer.cancel()
            self._closing_timer = None
        for channel in list(self.channels.values()):
            channel_methods.release_channel(self, channel)
        self.channels.clear()
        if self.vhost is not None:
            for queue in list(self.vhost.queues.values()):
                if queue.exclusive_owner is self:
                    self.vhost.remove_queue(queue)
        self.gateway.sessions.discard(self)
        self.gateway.flow_held.discard(self)
        if self.opened:
            self.opened = False
            self.log.info("closed AMQP connection %s", self.log.fields[CONNECTION])
        if self.client is not None:
            self.broker.clients.pop(self.client.name, None)
            self.client = None
        if self.vhost is not None:
            self.broker.tracking.remove(self, self.vhost.name, self.user)
        self.flush()

    def open_channel_count(self) -> int:
        """For the user's max-channels (streamq/broker/connection_tracking.py)."""
        return self.conn.open_channel_count()

    # -- heartbeats ------------------------------------------------------------------------

    def _schedule_heartbeat(self, delay_s: float) -> None:
        loop = asyncio.get_running_loop()
        self._heartbeat = loop.call_later(delay_s, self._on_heartbeat)

    def _on_heartbeat(self) -> None:
        now = time.monotonic()
        if self.conn.state < State.OPEN and now - self._connected_s > HANDSHAKE_TIMEOUT_S:
            self.log.warning("handshake timeout from client %s, closing", self.peer)
            self._abort()
            return
        if not self.conn.check_heartbeat(now):
            self.log.warning("missed heartbeats from client %s, closing", self.peer)
            self._abort()
            return
        self.flush()
        heartbeat_s = self.conn.heartbeat_s
        if self.conn.state < State.OPEN:
            self._schedule_heartbeat(HEARTBEAT_CHECK_FIRST_S)
        else:
            self._schedule_heartbeat(heartbeat_s / 2 if heartbeat_s > 0 else HEARTBEAT_IDLE_CHECK_S)

    # -- publish and confirms --------------------------------------------------------------

    # -- methods (amqp_gateway.entity_methods and basic_methods) ---------------------------

    def reply_pending(self) -> bool:
        """Whether a reply (a durable declare's, a confirm's fsync) holds the events
        after it (`reply_durable`): what comes meanwhile waits in order (`hold`)."""
        return self._waiting is not None

    def hold(self, event: Event) -> None:
        """Keep `event` until the pending reply went out (`reply_pending`)."""
        self._held.append(event)

    def current_vhost(self) -> VHost:
        assert self.vhost is not None
        return self.vhost
