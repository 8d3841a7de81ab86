"""The differential harness: a scenario is written once as a function of a `Session` and
run against two brokers; what a client could observe is recorded as a list of plain
values, and the two lists must be equal (tests/differential/README.md).

A scenario acts through the session: raw frames on `WireClient`s (`s.connect()`), pika
or aio-pika calls whose results it records with `s.record(...)`, and management API
requests (`s.http(...)`). Names are derived from the scenario's name, so both brokers
see the same ones and no scenario sees another's entities.

What is compared, per connection and in the order the client read it: every method the
broker sent with all its fields, content (properties and body), and whatever the scenario
recorded. What varies by design between runs is normalized before comparing: server-made
consumer tags and queue names (`amq.ctag-*`, `amq.gen-*`) and timestamps.

Waiting is explicit. A synchronous method waits for its reply (or a close); asynchronous
ones are followed by `sync`, which sends a passive declare of `amq.direct` on the same
channel and reads until its declare-ok or a close, so an error caused by the publish
before it is read first. Deliveries and confirms come from other processes in RabbitMQ,
so a scenario waits for them by count (`expect`), never by sleeping.
"""

from __future__ import annotations

import base64
import http.client
import json
import re
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

import pika

from amqp_gateway import codec
from amqp_gateway.codec import methods as m
from tests.differential.peers import Endpoint
from tests.differential.wire import Closed, Observation, Silence, WireClient

REPLY_TIMEOUT_S = 3.0  # a reply both brokers send at once; a miss is a difference
QUIET_S = 0.25  # how long `quiet` listens for frames that should not come
# A management request: RabbitMQ imports definitions in over 10 s on a loaded 2-core
# machine running the suite on 4 workers (a fresh-clone run timed out at 10 s).
HTTP_TIMEOUT_S = 30.0
_REPLIES: dict[str, tuple[str, ...]] = {
    "basic.get": ("basic.get-ok", "basic.get-empty"),
}
_GENERATED = re.compile(r"amq\.(ctag|gen)-[A-Za-z0-9_\-]+")
_TIME_KEYS = frozenset({"time", "timestamp", "x-opt-timestamp", "timestamp_in_ms"})


def normalize(value: Any) -> Any:
    """`value` with server-made names masked and times blanked, recursively."""
    if isinstance(value, str):
        return _GENERATED.sub(lambda match: f"amq.{match[1]}-*", value)
    if isinstance(value, bytes):
        return value
    if isinstance(value, dict):
        return {
            k: ("<time>" if k in _TIME_KEYS else normalize(v)) for k, v in sorted(value.items())
        }
    if isinstance(value, list | tuple):
        return type(value)(normalize(v) for v in value)
    return value


class ScenarioAbort(Exception):
    """A wait ran out; the scenario stops and what was read so far is compared."""


@dataclass
class Scenario:
    name: str
    run: Callable[[Session], None]
    tags: frozenset[str] = frozenset()


SCENARIOS: dict[str, Scenario] = {}


def scenario(name: str, *tags: str) -> Callable[[Callable[[Session], None]], Callable[..., None]]:
    """Register `fn` as scenario `name` (unique)."""

    def register(fn: Callable[[Session], None]) -> Callable[[Session], None]:
        assert name not in SCENARIOS, f"scenario {name!r} twice"
        SCENARIOS[name] = Scenario(name, fn, frozenset(tags))
        return fn

    return register


class Conn:
    """One raw connection of a session; every observation goes to the session's log,
    tagged with this connection's number."""

    def __init__(self, session: Session, number: int, client: WireClient) -> None:
        self.session = session
        self.number = number
        self.client = client

    def _log(self, observation: Observation) -> None:
        self.session.log.append((f"c{self.number}", *observation))

    @property
    def closed(self) -> bool:
        return self.client.closed

    def _read_until(self, done: Callable[[Observation], bool], timeout_s: float) -> Observation:
        """Read and log until `done(observation)`; that one is logged and returned."""
        while True:
            if self.client.closed and not self.client.buffer:
                self._log(("closed",))
                raise ScenarioAbort("connection closed")
            try:
                observation = self.client.read(timeout_s)
            except Silence:
                self._log(("silence",))
                raise ScenarioAbort("no reply") from None
            except Closed:
                self._log(("socket closed",))
                raise ScenarioAbort("socket closed") from None
            self._log(observation)
            if done(observation):
                return observation

    def _is_end(self, observation: Observation, channel: int) -> bool:
        name = observation[2]
        return name == "connection.close" or (name == "channel.close" and observation[1] == channel)

    # Synchronous and asynchronous methods.
    def call(self, channel: int, method: codec.Method) -> Observation:
        """Send `method` and read until its reply on `channel` or a close."""
        replies = _REPLIES.get(method.NAME, (f"{method.NAME}-ok",))
        self.client.send(channel, method)
        return self._read_until(
            lambda o: (o[1] == channel and o[2] in replies) or self._is_end(o, channel),
            REPLY_TIMEOUT_S,
        )

    def send(self, channel: int, method: codec.Method) -> None:
        self.client.send(channel, method)

    def sync(self, channel: int) -> None:
        """A round trip on `channel`: what the broker sent before its answer is logged;
        the fence's own declare-ok is not (both brokers send it)."""
        self.client.send(channel, m.ExchangeDeclare(exchange="amq.direct", passive=True))
        observation = self._read_until(
            lambda o: (
                (o[1] == channel and o[2] == "exchange.declare-ok") or self._is_end(o, channel)
            ),
            REPLY_TIMEOUT_S,
        )
        if observation[2] == "exchange.declare-ok":
            self.session.log.pop()

    def open(self, channel: int = 1) -> Observation:
        return self.call(channel, m.ChannelOpen())

    def publish(
        self,
        channel: int,
        exchange: str,
        routing_key: str,
        body: bytes = b"x",
        properties: codec.BasicProperties | None = None,
        *,
        mandatory: bool = False,
        frame_max: int | None = None,
    ) -> None:
        method = m.BasicPublish(exchange=exchange, routing_key=routing_key, mandatory=mandatory)
        self.client.send_content(channel, method, body, properties, frame_max)

    def expect(self, count: int, *names: str, timeout_s: float = REPLY_TIMEOUT_S) -> None:
        """Read until `count` observations named one of `names` (or a connection close)."""
        seen = 0
        while seen < count:
            observation = self._read_until(
                lambda o: o[2] in names or o[2] == "connection.close", timeout_s
            )
            if observation[2] == "connection.close":
                return
            seen += 1

    def expect_logged(self, count: int, name: str) -> None:
        """`expect` until this connection has logged `count` observations named `name`
        in all, counting those already logged (while an earlier call read its reply)."""
        me = f"c{self.number}"
        logged = sum(1 for o in self.session.log if o[0] == me and o[3:4] == (name,))
        if logged < count:
            self.expect(count - logged, name)

    def confirms(self, channel: int, last_tag: int) -> None:
        """Read until publish `last_tag` on `channel` is confirmed (ack or nack, multiple
        or not), logging every confirm as it came (RabbitMQ may batch them differently;
        `confirm_tags` gives the per-tag outcome to compare)."""
        state = self.session.confirmed.setdefault((self.number, channel), {})

        def done(o: Observation) -> bool:
            if o[1] == channel and o[2] in ("basic.ack", "basic.nack"):
                tag, multiple = o[3]["delivery_tag"], o[3]["multiple"]
                outcome = o[2]
                for settled in range(1 if multiple else tag, tag + 1):
                    state.setdefault(settled, outcome)
                self.session.log.pop()  # compared per tag, at the end of the run
                return all(t in state for t in range(1, last_tag + 1))
            return self._is_end(o, channel)

        self._read_until(done, REPLY_TIMEOUT_S)

    def quiet(self, seconds: float = QUIET_S) -> None:
        """Log whatever arrives within `seconds` (frames that must not come)."""
        while not self.client.closed:
            try:
                self._log(self.client.read(seconds))
            except (Silence, Closed):
                return

    def close(self) -> None:
        """connection.close, read up to its close-ok: stray frames are logged too."""
        if self.client.closed:
            return
        self.client.send(0, m.ConnectionClose(reply_code=200, reply_text="bye"))
        with _aborts():
            self._read_until(lambda o: o[2] in ("connection.close-ok",), REPLY_TIMEOUT_S)


def _aborts() -> suppress[ScenarioAbort]:
    return suppress(ScenarioAbort)


@dataclass
class Session:
    """One run of one scenario against one broker."""

    endpoint: Endpoint
    prefix: str
    log: list[Observation] = field(default_factory=list)
    conns: list[Conn] = field(default_factory=list)
    confirmed: dict[tuple[int, int], dict[int, str]] = field(default_factory=dict)
    cleanups: list[Callable[[], None]] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return self.endpoint.name

    def name(self, base: str = "q") -> str:
        """A name unique to this scenario, the same on every broker."""
        return f"{self.prefix}{base}"

    def record(self, *values: object) -> None:
        self.log.append(("record", *values))

    def connect(self, **tune: Any) -> Conn:
        """A raw connection, open on vhost "/" (or as `tune` says); logs the open-ok or
        what came instead."""
        client = WireClient("127.0.0.1", self.endpoint.amqp_port)
        conn = Conn(self, len(self.conns) + 1, client)
        self.conns.append(conn)
        try:
            for observation in client.handshake(**tune):
                conn._log(observation)
        except (Silence, Closed):
            conn._log(("handshake ended",))
        return conn

    def channel(self, number: int = 1, conn: Conn | None = None) -> Conn:
        """A connection with channel `number` open (the first connection if there is
        one and `conn` is not given)."""
        if conn is None:
            conn = self.conns[0] if self.conns else self.connect()
        conn.open(number)
        return conn

    def pika(self, **params: Any) -> pika.BlockingConnection:
        connection = pika.BlockingConnection(
            pika.ConnectionParameters(
                "127.0.0.1",
                self.endpoint.amqp_port,
                blocked_connection_timeout=REPLY_TIMEOUT_S,
                socket_timeout=REPLY_TIMEOUT_S,
                **params,
            )
        )
        self.cleanups.append(lambda: connection.close() if connection.is_open else None)
        return connection

    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.endpoint.amqp_port}/"

    def http(
        self, method: str, path: str, body: object = None, *, user: str = "guest"
    ) -> tuple[int, Any]:
        """One management API request with `body` as JSON: (status, parsed JSON or None)."""
        payload = None if body is None else json.dumps(body).encode()
        status, _, parsed = self.http_raw(method, path, payload, user=user)
        return status, parsed

    def http_raw(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        content_type: str = "application/json",
        *,
        user: str = "guest",
    ) -> tuple[int, dict[str, str], Any]:
        """One request with `body` sent as is, as `user` (whose password is its name):
        (status, headers with lower-case names, parsed JSON or None)."""
        conn = http.client.HTTPConnection(
            "127.0.0.1", self.endpoint.http_port, timeout=HTTP_TIMEOUT_S
        )
        token = base64.b64encode(f"{user}:{user}".encode()).decode()
        headers = {"Authorization": f"Basic {token}", "Content-Type": content_type}
        try:
            conn.request(method, path, body, headers)
            response = conn.getresponse()
            data = response.read()
            got = {name.lower(): value for name, value in response.getheaders()}
        finally:
            conn.close()
        try:
            parsed = json.loads(data) if data else None
        except ValueError:
            parsed = None
        return response.status, got, parsed

    def finish(self) -> None:
        for conn in self.conns:
            conn.close()
            conn.client.close()
        for cleanup in reversed(self.cleanups):
            with suppress(Exception):  # a connection the broker closed already
                cleanup()


def run_scenario(spec: Scenario, endpoint: Endpoint, prefix: str) -> list[Observation]:
    """Run `spec` against `endpoint`; its normalized observations."""
    session = Session(endpoint, prefix)
    try:
        spec.run(session)
    except ScenarioAbort as abort:
        session.log.append(("aborted", str(abort)))
    finally:
        session.finish()
    for (number, channel), outcomes in sorted(session.confirmed.items()):
        session.log.append(("confirms", number, channel, sorted(outcomes.items())))
    return [normalize(observation) for observation in session.log]


def explain(expected: list[Observation], observed: list[Observation]) -> str:
    """Where two runs part: the observations around the first difference, both sides."""
    index = next(
        (i for i, (a, b) in enumerate(zip(expected, observed, strict=False)) if a != b),
        min(len(expected), len(observed)),
    )
    lines = [f"first difference at observation {index}; same before it:"]
    lines += [f"    {o}" for o in expected[max(0, index - 6) : index]]
    lines.append("  RabbitMQ then:")
    lines += [f"    {o}" for o in expected[index : index + 6]]
    lines.append("  streamq then:")
    lines += [f"    {o}" for o in observed[index : index + 6]]
    return "\n".join(lines)
