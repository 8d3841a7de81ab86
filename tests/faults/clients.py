"""The fault suite's clients: publishers with confirms and consumers with acks, each a
thread with pika's blocking connection, that go on through every fault (reconnecting to
the next node when theirs goes away) and record what they see in a `Recorder` as the
history's events (tests/faults/history.py). A message's body is its name in the run.

What a publisher records: `confirmed` for basic.ack, `refused` for basic.nack or a
return (mandatory, unroutable), `unknown` when the connection ends before an answer.
The node of an event is the one that served the connection: the `node` server property
(in a cluster the leader, also behind a follower that forwards the connection). A
delivery also records which of the consumer's connections it came on (`session`): a
delivery sent before a connection broke can still reach the client after the broker gave
that connection up and delivered the message again (tests/faults/checker.py tells them
apart).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import pika
import pika.adapters.utils.connection_workflow as workflow
import pika.exceptions

from tests.faults.history import Ack, Delivery, Event, Outcome, Publish, Remaining

HEARTBEAT_S: Final = 2  # a stalled node (SIGSTOP, a cut) is given up in a few seconds
SOCKET_TIMEOUT_S: Final = 2.0
BLOCKED_TIMEOUT_S: Final = 10.0
RECONNECT_PAUSE_S: Final = 0.2
PREFETCH: Final = 50
CONSUME_POLL_S: Final = 0.2
DRAIN_IDLE_S: Final = 2.0  # a final drain ends after this long without a message
DRAIN_TIMEOUT_S: Final = 60.0
# The suite's user: guest may log in only from loopback, and the clients are not on the
# nodes' hosts. tests/faults/fault_cluster.py gives every node this user at boot.
USER: Final = ("faults", "faults")
# What ends a connection from the client's side: pika's errors and the socket's.
CONNECTION_ERRORS: Final = (
    pika.exceptions.AMQPError,
    workflow.AMQPConnectorException,
    workflow.AMQPConnectionWorkflowFailed,
    OSError,
)


class Recorder:
    """The run's events, appended from every client thread (list.append holds the GIL)."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def add(self, event: Event) -> None:
        self.events.append(event)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A node's AMQP address."""

    host: str
    port: int


def parameters(endpoint: Endpoint) -> pika.ConnectionParameters:
    return pika.ConnectionParameters(
        endpoint.host,
        endpoint.port,
        credentials=pika.PlainCredentials(*USER),
        heartbeat=HEARTBEAT_S,
        socket_timeout=SOCKET_TIMEOUT_S,
        stack_timeout=SOCKET_TIMEOUT_S * 3,
        blocked_connection_timeout=BLOCKED_TIMEOUT_S,
        connection_attempts=1,
    )


def serving_node(connection: pika.BlockingConnection) -> str:
    """The `node` server property: the node whose confirms and deliveries these are."""
    properties = connection._impl.server_properties or {}
    node = properties.get("node", "")
    return node.decode() if isinstance(node, bytes) else str(node)


class Client(threading.Thread):
    """A client thread that connects to the endpoints in turn until `stop` is set."""

    def __init__(
        self, name: str, endpoints: list[Endpoint], queue: str, recorder: Recorder
    ) -> None:
        super().__init__(name=f"faults-{name}", daemon=True)
        self.client_name = name
        self.endpoints = endpoints
        self.queue = queue
        self.recorder = recorder
        self.stop = threading.Event()
        self.connections = 0  # how many times it got connected
        self.failure: BaseException | None = None
        self._turn = 0

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # kept for the test to report: a dead client
            self.failure = exc
            raise

    def _run(self) -> None:
        while not self.stop.is_set():
            endpoint = self.endpoints[self._turn % len(self.endpoints)]
            self._turn += 1
            try:
                connection = pika.BlockingConnection(parameters(endpoint))
            except CONNECTION_ERRORS:
                self.stop.wait(RECONNECT_PAUSE_S)
                continue
            self.connections += 1
            try:
                self.session(connection)
            except CONNECTION_ERRORS:
                pass
            finally:
                with contextlib.suppress(*CONNECTION_ERRORS):
                    connection.close()

    def session(self, connection: pika.BlockingConnection) -> None:
        raise NotImplementedError


class Publisher(Client):
    """Publishes persistent messages one at a time, each confirmed before the next."""

    def __init__(
        self, name: str, endpoints: list[Endpoint], queue: str, recorder: Recorder
    ) -> None:
        super().__init__(name, endpoints, queue, recorder)
        self.sequence = 0

    def session(self, connection: pika.BlockingConnection) -> None:
        node = serving_node(connection)
        channel = connection.channel()
        channel.confirm_delivery()
        properties = pika.BasicProperties(delivery_mode=2)
        while not self.stop.is_set():
            message = f"{self.client_name}-{self.sequence}"
            sent = time.time()
            self.sequence += 1
            outcome: Outcome
            try:
                channel.basic_publish("", self.queue, message.encode(), properties, mandatory=True)
                outcome = "confirmed"
            except (pika.exceptions.NackError, pika.exceptions.UnroutableError):
                outcome = "refused"
            except CONNECTION_ERRORS:
                self._record(message, node, sent, "unknown", None)
                raise
            self._record(message, node, sent, outcome, time.time())

    def _record(
        self, message: str, node: str, sent: float, outcome: Outcome, answered: float | None
    ) -> None:
        sequence = self.sequence - 1
        self.recorder.add(
            Publish(self.queue, message, self.client_name, sequence, node, sent, outcome, answered)
        )


class Consumer(Client):
    """Consumes with manual acks, each message acked with its own basic.ack."""

    def session(self, connection: pika.BlockingConnection) -> None:
        node = serving_node(connection)
        channel = connection.channel()
        channel.basic_qos(prefetch_count=PREFETCH)
        add, queue, name = self.recorder.add, self.queue, self.client_name
        session = self.connections  # this connection's number, for the checker

        def on_message(
            ch: pika.adapters.blocking_connection.BlockingChannel,
            method: pika.spec.Basic.Deliver,
            _properties: pika.BasicProperties,
            body: bytes,
        ) -> None:
            message = body.decode()
            redelivered = bool(method.redelivered)
            add(Delivery(queue, message, name, node, time.time(), redelivered, session=session))
            ch.basic_ack(method.delivery_tag)
            add(Ack(queue, message, name, time.time()))

        channel.basic_consume(self.queue, on_message)
        while not self.stop.is_set():
            connection.process_data_events(time_limit=CONSUME_POLL_S)


class StreamReader(Client):
    """Reads a stream over AMQP from its first offset, acking each delivery (credit), and
    after a reconnect from the offset after the last one it read."""

    def __init__(
        self, name: str, endpoints: list[Endpoint], queue: str, recorder: Recorder
    ) -> None:
        super().__init__(name, endpoints, queue, recorder)
        self.next_offset: int | str = "first"

    def session(self, connection: pika.BlockingConnection) -> None:
        node = serving_node(connection)
        channel = connection.channel()
        channel.basic_qos(prefetch_count=PREFETCH)
        add, queue, name = self.recorder.add, self.queue, self.client_name
        session = self.connections  # this connection's number, for the checker

        def on_message(
            ch: pika.adapters.blocking_connection.BlockingChannel,
            method: pika.spec.Basic.Deliver,
            properties: pika.BasicProperties,
            body: bytes,
        ) -> None:
            offset = stream_offset(properties)
            at = time.time()
            add(Delivery(queue, body.decode(), name, node, at, offset=offset, session=session))
            self.next_offset = offset + 1
            ch.basic_ack(method.delivery_tag)

        arguments = {"x-stream-offset": self.next_offset}
        channel.basic_consume(self.queue, on_message, arguments=arguments)
        while not self.stop.is_set():
            connection.process_data_events(time_limit=CONSUME_POLL_S)


def stream_offset(properties: pika.BasicProperties) -> int:
    """The `x-stream-offset` header of a delivery from a stream."""
    offset = (properties.headers or {}).get("x-stream-offset")
    assert isinstance(offset, int), f"a stream delivery without x-stream-offset: {properties}"
    return offset


def read_stream(
    endpoints: list[Endpoint], stream: str, *, timeout_s: float = DRAIN_TIMEOUT_S
) -> Remaining:
    """Every record of `stream` from its first offset, with the offsets, read until none
    comes for DRAIN_IDLE_S; through whichever endpoint answers, bounded by `timeout_s`."""
    recorder = Recorder()
    reader = StreamReader("final", endpoints, stream, recorder)
    reader.start()
    deadline = time.monotonic() + timeout_s
    seen = 0
    idle_since = time.monotonic()
    while time.monotonic() - idle_since < DRAIN_IDLE_S or reader.connections == 0:
        if time.monotonic() > deadline:
            break
        time.sleep(CONSUME_POLL_S)
        if len(recorder.events) != seen:
            seen, idle_since = len(recorder.events), time.monotonic()
    stop_all([reader], timeout_s)
    if time.monotonic() > deadline:
        raise TimeoutError(f"{stream} could not be read to its end within {timeout_s} s")
    read: dict[int, str] = {}
    for event in recorder.events:
        assert isinstance(event, Delivery) and event.offset is not None
        earlier = read.setdefault(event.offset, event.message)  # reread after a reconnect
        assert earlier == event.message, (
            f"{stream} offset {event.offset} read as {earlier}, then as {event.message}"
        )
    offsets = tuple(sorted(read))
    return Remaining(stream, "stream", tuple(read[o] for o in offsets), offsets)


def drain(
    endpoints: list[Endpoint], queue: str, *, timeout_s: float = DRAIN_TIMEOUT_S
) -> Remaining:
    """What `queue` still holds: every message a basic.get with ack takes, until none
    comes for DRAIN_IDLE_S; through whichever endpoint answers, bounded by `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    taken: list[str] = []
    while time.monotonic() < deadline:
        for endpoint in endpoints:
            with contextlib.suppress(*CONNECTION_ERRORS):
                _drain_from(endpoint, queue, taken, deadline)
                return Remaining(queue, "queue", tuple(taken))
        time.sleep(RECONNECT_PAUSE_S)
    raise TimeoutError(f"no node let {queue} be drained within {timeout_s} s")


def _drain_from(endpoint: Endpoint, queue: str, taken: list[str], deadline: float) -> None:
    connection = pika.BlockingConnection(parameters(endpoint))
    try:
        channel = connection.channel()
        idle_since = time.monotonic()
        while time.monotonic() - idle_since < DRAIN_IDLE_S:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{queue} still had messages at the drain's deadline")
            method, _properties, body = channel.basic_get(queue)
            if method is None:
                connection.sleep(CONSUME_POLL_S)
                continue
            taken.append(body.decode())
            channel.basic_ack(method.delivery_tag)
            idle_since = time.monotonic()
    finally:
        with contextlib.suppress(*CONNECTION_ERRORS):
            connection.close()


def stop_all(clients: list[Client], timeout_s: float) -> None:
    """Sets every client's stop and joins them, each within `timeout_s`; fails if one
    had died before (a client must live through every fault)."""
    dead = [f"{c.name}: {c.failure!r}" for c in clients if not c.is_alive()]
    for client in clients:
        client.stop.set()
    for client in clients:
        client.join(timeout_s)
        assert not client.is_alive(), f"{client.name} did not stop within {timeout_s} s"
    assert not dead, f"clients died during the run: {dead}"


Factory = Callable[[str, list[Endpoint], str, Recorder], Client]
