"""The sans-IO AMQP 0-9-1 connection state machine (STYLE.md section 2).

Owns the protocol's rules for one connection: the order of the handshake (protocol
header, start, tune, open), channel life cycles, the fast path's runs of publishes and
acks, heartbeats and the close handshakes both ways. Bytes go in with `receive_data`,
events (amqp_gateway/events.py) come out of it, and bytes to send accumulate in
`outgoing`. What the handshake methods say is handshake.py's, a publish's content
assembly is assembly.py's, the states and their tables are states.py's. It has no
sockets, no clock (time is passed in) and no knowledge of queues or exchanges: the server
decides what a method means and answers through `send_method` and friends.

Rule 1: every error becomes a close in one place, `fail()`: a ChannelException closes its
channel, a ConnectionException (or any error on channel 0) the connection.
Rule 2: after we send a close, frames for that channel (or connection) are discarded
until the close-ok, as the spec requires (sections 4.2.6 and 4.10.2 of the 0-9-1 spec).
Rule 3: what the client reads follows the order of the frames it sent. A frame that the
protocol answers itself (channel.open, channel.close, connection.close, update-secret) or
refuses (any protocol error) is not parsed while events read before it in the same call
wait for the server, whose handling may send something first or change the answer (a
publish to a missing exchange closes its channel, so a channel.close read after it is
answered with close-ok after the server's channel.close 404, as RabbitMQ's channel process
handles them one after the other). Parsing stops before that frame (`parse_paused`) and
goes on when the server calls `resume_parse`. Publishes and methods handed to the server
never stop it: the hot path is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from amqp_gateway import assembly, codec, errors, handshake, states
from amqp_gateway.codec import methods as m
from amqp_gateway.codec.erlang_text import unexpected_frame_text
from amqp_gateway.codec.frame import received_payload_max
from amqp_gateway.codec.method_memo import MethodMemo
from amqp_gateway.errors import (
    AMQPError,
    ChannelError,
    ChannelException,
    CommandInvalid,
    ConnectionException,
    NotAllowed,
    ReplyCode,
    UnexpectedFrame,
)
from amqp_gateway.events import (
    AckRun,
    ChannelClosed,
    ConnectionClosed,
    Event,
    MethodReceived,
    OpenRequested,
    PublishRun,
)
from amqp_gateway.states import ChannelState, State
from amqp_gateway.tuning import CHANNEL_MAX, FRAME_MAX, HEARTBEAT_S, MESSAGE_BYTES_MAX, AmqpTuning

# The defaults of what connection.tune offers (CHANNEL_MAX, FRAME_MAX, HEARTBEAT_S) and of
# the largest message (MESSAGE_BYTES_MAX) live in amqp_gateway/tuning.py with the ranges
# an operator may set; names kept here for the code and tests that read them here.
__all__ = ["CHANNEL_MAX", "FRAME_MAX", "HEARTBEAT_S", "MESSAGE_BYTES_MAX"]

# Publishes per PublishRun event: the server handles a run without a break, so this
# bounds the time a run keeps consumers waiting (EVENTS_PER_SLICE counts its messages).
PUBLISH_RUN_MESSAGES_MAX: Final = 256
# Acks, nacks and rejects per AckRun event: the server settles a run in one step, and
# the slices count its tags as they counted one event per ack before (EVENTS_PER_SLICE).
ACK_RUN_TAGS_MAX: Final = 512
# Until tune-ok is in, frames are limited to the spec's minimum size (4.2.1 of 0-9-1).
_PRE_TUNE_FRAME_MAX: Final = codec.FRAME_MIN_SIZE
_DEFAULT_TUNING: Final = AmqpTuning()
_NO_READ: Final = bytearray()


def _no_refusal() -> str | None:
    return None


class _AnswerLater(Exception):
    """Rule 3: the frame being parsed needs the protocol's own answer while events read
    before it wait for the server (raised before any state changes)."""


class Connection:
    """One AMQP connection, server side."""

    def __init__(
        self,
        server_properties: codec.FieldTable,
        now_s: float,
        tuning: AmqpTuning = _DEFAULT_TUNING,
    ) -> None:
        self.state = State.AWAIT_HEADER
        self.outgoing = bytearray()
        self.tuning = tuning  # what connection.tune offers: the most tune-ok may ask for
        self.channel_max = tuning.channel_max
        self.frame_max = _PRE_TUNE_FRAME_MAX
        self.heartbeat_s = 0
        self.message_bytes_max = tuning.message_bytes_max
        self.username = ""
        self.virtual_host = ""
        self.client_properties: codec.FieldTable = {}
        # What connection.start offers: the server adds EXTERNAL on a TLS connection
        # with a verified client certificate (external_auth.py).
        self.mechanisms = handshake.MECHANISMS
        self._server_properties = server_properties
        self._buffer = bytearray()
        self._read_into = _NO_READ  # the buffer `read_buffer` handed out
        # Rule 3: parsing stopped before a frame to answer once the server has handled
        # the events read before it; `_buffer` holds that frame and what followed.
        self.parse_paused = False
        self._channels: dict[int, assembly.ProtocolChannel] = {}
        self._methods = MethodMemo()  # channel methods seen before, kept decoded
        # Asked at each channel.open, after channel_max: RabbitMQ's 530 text when the
        # server refuses one more channel (a user's max-channels), else None.
        self.channel_gate: Callable[[], str | None] = _no_refusal
        self._last_received_s = now_s
        self._last_sent_s = now_s
        # We answered the client's connection.close: it hangs up once it reads the
        # close-ok, and bytes it sent before reading it are still on their way (the
        # server reads and discards them until then, as RabbitMQ's closed state).
        self.close_ok_sent = False

    # -- input -----------------------------------------------------------------------------

    def receive_data(self, data: bytes, now_s: float) -> list[Event]:
        """Feed bytes from the socket; returns the events they complete.

        Protocol errors do not raise: they become a channel or connection close in
        `outgoing` (and, for the connection, a ConnectionClosed event once it is over).
        Parsing may stop before a frame the protocol answers itself (rule 3): then
        `parse_paused` is set, and `resume_parse` goes on once these events are handled.
        """
        self._last_received_s = now_s
        if self.state is State.CLOSED:
            return []
        if self.parse_paused:
            # Rule 3: the server reads nothing while it holds events; should it still,
            # the bytes wait behind the paused frame.
            self._buffer += data
            return []
        return self._parse(data)

    def resume_parse(self) -> list[Event]:
        """Rule 3: the server has handled every event returned so far; parse on from the
        frame that parsing stopped before. [] when not paused."""
        if not self.parse_paused:
            return []
        self.parse_paused = False
        if self.state is State.CLOSED:
            return []
        return self._parse(b"")

    def _parse(self, data: bytes) -> list[Event]:
        buffer = self._buffer
        events: list[Event] = []
        # Parse from the buffer when it holds something, else straight from the read: no
        # copy of the input beyond the slices that become bodies and payloads.
        source: bytes | bytearray = data
        if self.state is State.AWAIT_HEADER:
            buffer += data
            source = buffer
            try:
                if not self._receive_header():
                    return events
            except ConnectionException as exc:
                self.fail(exc, 0, events)
                return events
        elif buffer:
            buffer += data  # a partial frame waited for the rest
            source = buffer
        with memoryview(source) as view:
            position = self._receive_frames(view, events)
        if source is buffer:
            del buffer[:position]
        elif position < len(data):
            buffer += data[position:]
        return events

    def read_buffer(self, shared: bytearray, room_max: int) -> memoryview:
        """Where the next read from the socket goes (asyncio's BufferedProtocol): the
        partial frame left by the last read is copied to the start of `shared`, and the
        read lands right after it, at most `room_max` bytes. `receive_read` then parses
        both in place. `shared` serves every connection: nothing refers to it once
        `receive_read` returns. A leftover too large for it gets a buffer of its own."""
        pending = self._buffer
        size = len(pending)
        if size + room_max > len(shared):
            shared = bytearray(size + room_max)
        shared[:size] = pending
        self._read_into = shared
        return memoryview(shared)[size : size + room_max]

    def receive_read(self, nbytes: int, now_s: float) -> list[Event]:
        """`receive_data` for `nbytes` read into the buffer from `read_buffer`."""
        shared = self._read_into
        self._read_into = _NO_READ
        pending = len(self._buffer)
        if self.state is not State.OPEN or self.parse_paused:
            # Handshakes, closes and pauses are rare: the copying path does them.
            return self.receive_data(bytes(shared[pending : pending + nbytes]), now_s)
        self._last_received_s = now_s
        events: list[Event] = []
        with memoryview(shared) as whole, whole[: pending + nbytes] as view:
            position = self._receive_frames(view, events)
            self._buffer = bytearray(view[position:])
        return events

    def _receive_frames(self, view: memoryview, events: list[Event]) -> int:
        """Parse whole frames of `view` into `events`; returns where the rest starts."""
        position = start = 0
        try:
            # After this loop at most one partial frame is left, and read_frame rejects a
            # payload over frame_max (RabbitMQ's slack included) from its header alone.
            # A pause (rule 3) leaves the rest of the read instead, a frame_max or more.
            while True:
                if self.state is State.OPEN:
                    position = self._receive_runs(view, position, events)
                start = position
                frame, position = codec.read_frame(view, position, self.frame_max)
                if frame is None:
                    break
                self._receive_frame(frame, events)
                if self._is_closed():
                    break
        except _AnswerLater:
            self.parse_paused = True
            return start
        except ConnectionException as exc:
            if events:  # rule 3: refused once the events before it are handled
                self.parse_paused = True
                return start
            self.fail(exc, 0, events)
            # Out of step with the client: the rest of this read is dropped, so that the
            # close-ok of a later read is parsed from a frame boundary (rule 2).
            return len(view)
        return position

    def _receive_runs(self, data: memoryview, position: int, events: list[Event]) -> int:
        """Hot path: runs of publishes and of acks, in the order they came, until a frame
        of another kind (or one the frame-by-frame path must judge); returns where it
        starts."""
        while True:
            after = self._receive_acks(
                data, self._receive_publishes(data, position, events), events
            )
            if after == position:
                return position
            position = after

    def _receive_acks(self, data: memoryview, position: int, events: list[Event]) -> int:
        """Hot path: whole, well-formed basic.ack, nack and reject frames from `position`
        on become AckRun events, a C call per run (`codec.scan_acks`); returns where the
        first frame of another kind starts. The guards are `_receive_publishes`' own: an
        ack on a channel that is not open, or in the middle of a publish's content, is
        left to the frame-by-frame path, which reports it."""
        channels = self._channels
        payload_max = received_payload_max(self.frame_max)
        scan = codec.scan_acks
        while True:
            channel_id, end, tags, kinds, flags = scan(
                data, position, payload_max, ACK_RUN_TAGS_MAX
            )
            if not tags:
                return position
            channel = channels.get(channel_id)
            if (
                channel is None
                or channel.state is not ChannelState.OPEN
                or channel.publish is not None
            ):
                return position
            events.append(AckRun(channel_id, tags, kinds, flags))
            position = end

    def _receive_publishes(self, data: memoryview, position: int, events: list[Event]) -> int:
        """Hot path: whole, well-formed publishes from `position` on become PublishRun
        events, a C call per run (`codec.scan_publishes`); returns where the first frame
        of another kind starts (or a publish the frame-by-frame path must judge)."""
        channels = self._channels
        # As read_frame: a received payload may be frame_max bytes (RabbitMQ's slack).
        payload_max = received_payload_max(self.frame_max)
        size_max = self.message_bytes_max
        scan = codec.scan_publishes
        while True:
            channel_id, end, messages, bits, flags = scan(
                data, position, payload_max, size_max, PUBLISH_RUN_MESSAGES_MAX
            )
            if not messages:
                return position
            channel = channels.get(channel_id)
            if (
                channel is None
                or channel.state is not ChannelState.OPEN
                or channel.publish is not None
            ):
                return position  # the frame-by-frame path reports what is wrong
            events.append(PublishRun(channel_id, messages, bits, flags))
            position = end

    def _is_closed(self) -> bool:
        # A method so that mypy does not narrow `state` across the calls that change it.
        return self.state is State.CLOSED

    def _receive_header(self) -> bool:
        version, used = codec.parse_protocol_header(self._buffer)
        if version is None:
            return False
        del self._buffer[:used]
        self.state = State.AWAIT_START_OK
        self.send_method(0, handshake.connection_start(self._server_properties, self.mechanisms))
        return True

    def _receive_frame(self, frame: codec.Frame, events: list[Event]) -> None:
        frame_type, channel_id, payload = frame
        if frame_type == codec.FRAME_HEARTBEAT:
            codec.check_heartbeat_frame(frame)
            return
        if channel_id == 0:
            if frame_type == codec.FRAME_METHOD:
                self._receive_connection_method(codec.decode_method(payload), events)
            elif self.state is not State.CLOSING:  # else rule 2: discard until close-ok
                raise UnexpectedFrame(unexpected_frame_text(frame_type, payload))
            return
        if self.state is State.CLOSING:
            return  # Rule 2: discard until close-ok
        if self.state is not State.OPEN:
            # RabbitMQ takes no frame off channel 0 before connection.open-ok.
            raise UnexpectedFrame(unexpected_frame_text(frame_type, payload))
        channel = self._channels.get(channel_id)
        if channel is not None and channel.state is ChannelState.CLOSING:
            if frame_type == codec.FRAME_METHOD:
                self._receive_on_closing_channel(channel_id, codec.decode_method(payload), events)
            return
        try:
            if frame_type == codec.FRAME_METHOD:
                self._receive_channel_method(channel_id, channel, payload, events)
            elif channel is None:
                # RabbitMQ makes the channel at its first frame, and its assembler
                # wants a method frame.
                raise UnexpectedFrame(assembly.EXPECTED_METHOD_FRAME)
            elif frame_type == codec.FRAME_HEADER:
                assembly.receive_content_header(
                    channel_id, channel, payload, self.message_bytes_max, events
                )
            else:
                assembly.receive_body(channel_id, channel, payload, events)
        except ChannelException as exc:
            _answer_in_order(events)
            self.fail(exc, channel_id, events)

    def _receive_channel_method(
        self,
        channel_id: int,
        channel: assembly.ProtocolChannel | None,
        payload: bytes,
        events: list[Event],
    ) -> None:
        if payload.startswith(codec.BASIC_PUBLISH_IDS):
            # Hot path: basic.publish skips the generic decoder.
            if channel is None:
                raise ChannelError("expected 'channel.open'", 60, 40)
            if channel.publish is not None:
                raise assembly.content_expected(channel)
            channel.publish = codec.read_basic_publish(payload)
            return
        method = self._methods.decode(payload)
        if channel is not None and channel.publish is not None:
            raise assembly.content_expected(channel)
        if isinstance(method, m.ChannelOpen):
            _answer_in_order(events)
            if channel is not None:
                raise ChannelError("second 'channel.open' seen", 20, 10)
            # channel_max limits how many channels are open at once, whatever their
            # numbers, as RabbitMQ 3.10 (rabbit_reader:create_channel): a channel that
            # we closed counts until its close-ok. The spec's "highest channel number"
            # reading would refuse channel 65535, which RabbitMQ opens.
            open_count = len(self._channels)
            if open_count >= self.channel_max:
                raise NotAllowed(
                    f"number of channels opened ({open_count}) has reached the "
                    f"negotiated channel_max ({self.channel_max})"
                )
            refusal = self.channel_gate()
            if refusal is not None:  # a user's max-channels, with no method to blame
                raise NotAllowed(refusal)
            self._channels[channel_id] = assembly.ProtocolChannel()
            self.send_method(channel_id, m.ChannelOpenOk())
            events.append(MethodReceived(channel_id, method))  # the server lists it now
            return
        if channel is None:
            raise ChannelError("expected 'channel.open'", method.CLASS_ID, method.METHOD_ID)
        if isinstance(method, m.ChannelClose):
            _answer_in_order(events)
            self.send_method(channel_id, m.ChannelCloseOk())
            del self._channels[channel_id]
            events.append(ChannelClosed(channel_id))
            return
        if isinstance(method, m.ChannelCloseOk):
            # RabbitMQ's channel has no clause for it when open (rabbit_channel).
            raise CommandInvalid("unimplemented method", 20, 41)
        events.append(MethodReceived(channel_id, method))

    def _receive_on_closing_channel(
        self, channel_id: int, method: m.Method, events: list[Event]
    ) -> None:
        if isinstance(method, m.ChannelClose):
            # Closes crossed: answered, and the channel still waits for the close-ok of
            # ours, as RabbitMQ's closing channel does (rabbit_channel:handle_method/3
            # replies close-ok to channel.close and stops only at channel.close-ok).
            _answer_in_order(events)
            self.send_method(channel_id, m.ChannelCloseOk())
            return
        if isinstance(method, m.ChannelOpen):
            # RabbitMQ's closing channel still refuses it (rabbit_channel:handle_method/3
            # checks channel.open before its closing state).
            raise ChannelError("second 'channel.open' seen", 20, 10)
        if isinstance(method, m.ChannelCloseOk):
            del self._channels[channel_id]
            events.append(ChannelClosed(channel_id))
        # Anything else is discarded until the close-ok (rule 2).

    # -- connection class --------------------------------------------------------------------

    def _receive_connection_method(self, method: m.Method, events: list[Event]) -> None:
        state = self.state
        if state is State.CLOSING:  # rule 2: only the close handshake counts
            if isinstance(method, m.ConnectionClose):
                _answer_in_order(events)
                self.send_method(0, m.ConnectionCloseOk())
                self.close_ok_sent = True
                self._closed(events, method.reply_code, method.reply_text)
            elif isinstance(method, m.ConnectionCloseOk):
                self._closed(events, 200, "closed")
            return
        if state is State.OPEN and isinstance(method, m.ConnectionClose):
            _answer_in_order(events)
            self.send_method(0, m.ConnectionCloseOk())
            self.close_ok_sent = True
            self._closed(events, method.reply_code, method.reply_text)
        elif state is State.OPEN and isinstance(method, m.ConnectionUpdateSecret):
            _answer_in_order(events)
            self.send_method(0, m.ConnectionUpdateSecretOk())
        elif not isinstance(method, states.EXPECTED_METHOD.get(state, ())):
            # Anything else, a second connection.open or start-ok included, is what
            # RabbitMQ's handle_method0/2 refuses last.
            raise ChannelError(
                f"unexpected method in connection state {states.RABBITMQ_STATE_NAMES[state]}",
                method.CLASS_ID,
                method.METHOD_ID,
            )
        elif isinstance(method, m.ConnectionStartOk):
            self.client_properties = method.client_properties
            events.append(handshake.login_request(method, self.mechanisms))
        elif isinstance(method, m.ConnectionTuneOk):
            self._tune(method)
        else:
            assert isinstance(method, m.ConnectionOpen)
            events.append(OpenRequested(method.virtual_host))

    def accept_login(self, username: str) -> None:
        """The server checked the credentials: offer the tuning parameters."""
        self.username = username
        self.state = State.AWAIT_TUNE_OK
        self.send_method(0, handshake.connection_tune(self.tuning))

    def _tune(self, method: m.ConnectionTuneOk) -> None:
        handshake.check_tune_ok(method, self.tuning)
        self.channel_max = method.channel_max
        self.frame_max = method.frame_max
        self.heartbeat_s = method.heartbeat
        self.state = State.AWAIT_OPEN

    def accept_open(self, virtual_host: str) -> None:
        self.virtual_host = virtual_host
        self.state = State.OPEN
        self.send_method(0, m.ConnectionOpenOk())

    # -- output ------------------------------------------------------------------------------

    def send_method(self, channel: int, method: m.Method) -> None:
        codec.append_method_frame(self.outgoing, codec.ChannelId(channel), method)

    def send_content(
        self, channel: int, method: m.Method, properties_raw: bytes, body: bytes
    ) -> None:
        codec.append_content_frames(
            self.outgoing, codec.ChannelId(channel), method, properties_raw, body, self.frame_max
        )

    def take_outgoing(self, now_s: float) -> bytes:
        """The bytes to write to the socket now; empties the buffer."""
        if not self.outgoing:
            return b""
        self._last_sent_s = now_s
        data = bytes(self.outgoing)
        self.outgoing.clear()
        return data

    def note_sent(self, now_s: float) -> None:
        self._last_sent_s = now_s

    def open_channel_count(self) -> int:
        """Channels open or closing (a channel we closed counts until its close-ok)."""
        return len(self._channels)

    def is_channel_open(self, channel: int) -> bool:
        state = self._channels.get(channel)
        return state is not None and state.state is ChannelState.OPEN

    def is_channel_closing(self, channel: int) -> bool:
        """We closed the channel (an error) and wait for the close-ok (rule 2)."""
        state = self._channels.get(channel)
        return state is not None and state.state is ChannelState.CLOSING

    # -- heartbeats --------------------------------------------------------------------------

    def check_heartbeat(self, now_s: float) -> bool:
        """Call about every heartbeat/2 seconds. Queues a heartbeat if we have been quiet
        and returns False when the peer has been silent for two intervals (spec 4.2.7):
        the server then drops the connection without a close handshake.
        """
        if self.heartbeat_s <= 0 or self.state is State.CLOSED:
            return True
        if now_s - self._last_received_s > 2 * self.heartbeat_s:
            self.state = State.CLOSED
            return False
        if now_s - self._last_sent_s >= self.heartbeat_s / 2:
            self.outgoing += codec.HEARTBEAT_FRAME
        return True

    # -- errors and closing ------------------------------------------------------------------

    def fail(self, exc: AMQPError, channel: int, events: list[Event]) -> None:
        """Rule 1: the one place an AMQP error becomes a close."""
        if isinstance(exc, ChannelException) and channel != 0:
            state = self._channels.get(channel)
            if state is None or state.state is ChannelState.CLOSING:
                return
            state.state = ChannelState.CLOSING
            state.publish = None
            self.send_method(
                channel,
                m.ChannelClose(
                    reply_code=exc.reply_code,
                    reply_text=errors.reply_text(exc),
                    class_id=exc.class_id,
                    method_id=exc.method_id,
                ),
            )
            return
        self.close(exc.reply_code, errors.reply_text(exc), exc.class_id, exc.method_id, events)

    def close(
        self, reply_code: int, reply_text: str, class_id: int, method_id: int, events: list[Event]
    ) -> None:
        """Start the connection close handshake (server-initiated)."""
        if self.state in (State.CLOSING, State.CLOSED):
            return
        if self.state is State.AWAIT_HEADER:
            # A client with a header we do not speak gets ours, then the socket closes
            # (0-9-1 section 4.2.2).
            self.outgoing += codec.PROTOCOL_HEADER_0_9_1
            self._closed(events, reply_code, reply_text)
            return
        if self.state in states.SILENT_STATES and not self._announces_refusal(reply_code):
            self._closed(events, reply_code, reply_text)
            return
        self.state = State.CLOSING
        self.send_method(
            0,
            m.ConnectionClose(
                reply_code=reply_code,
                reply_text=reply_text,
                class_id=class_id,
                method_id=method_id,
            ),
        )
        for channel_id in list(self._channels):
            del self._channels[channel_id]
            events.append(ChannelClosed(channel_id))

    def _announces_refusal(self, reply_code: int) -> bool:
        """A refused login is told to a client that announced it can take it."""
        return reply_code == ReplyCode.ACCESS_REFUSED and self.announces(
            "authentication_failure_close"
        )

    def announces(self, capability: str) -> bool:
        """Whether the client's start-ok listed `capability` as true (RabbitMQ sends
        basic.cancel and the refused-login close only to clients that do)."""
        capabilities = self.client_properties.get("capabilities")
        return isinstance(capabilities, dict) and capabilities.get(capability) is True

    def _closed(self, events: list[Event], reply_code: int, reply_text: str) -> None:
        self.state = State.CLOSED
        for channel_id in list(self._channels):
            del self._channels[channel_id]
            events.append(ChannelClosed(channel_id))
        events.append(ConnectionClosed(reply_code, reply_text))


def _answer_in_order(events: list[Event]) -> None:
    """Rule 3: call where a frame gets the protocol's own answer, before any state
    changes. Raises _AnswerLater if events read before it are still the server's to
    handle (they are all earlier in `events`: no frame adds one before it answers)."""
    if events:
        raise _AnswerLater
