"""One federation link: an upstream feeding a federated exchange or queue of this broker.

Owns what exchange and queue links share: the reconnect loop (one upstream URI after the
other, `reconnect-delay` between attempts, the error shown in the status meanwhile, never
a busy loop), the two connections of a session (the upstream, and this broker by a direct
connection, as RabbitMQ's link connects to its own node), forwarding a batch of deliveries
with the `x-received-from` hop added, settling them upstream by ack mode (`on-confirm`:
after the downstream's confirm, so nothing is lost when either end dies; `on-publish`;
`no-ack`), and the `Link` view in `Broker.links` (streamq.broker.links). The subclasses
say what a session declares upstream and where messages go downstream.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Final

from amqp_gateway import codec
from amqp_gateway.errors import AMQPSyntaxError
from streamq.broker.broker import Broker
from streamq.broker.link_definitions import UpstreamDefinition
from streamq.broker.links import FEDERATION
from streamq.links.amqp.client import (
    AmqpConnectionError,
    Channel,
    Connection,
    Delivery,
    DirectConnector,
)
from streamq.links.amqp.uri import AmqpUri, UriInvalid, parse_uri, quote_vhost
from streamq.links.federation.headers import (
    add_received_from,
    encoded_hop,
    received_from_entry,
    should_forward,
    splice_received_from,
    without_credentials,
)

logger = logging.getLogger(__name__)

CLEANUP_TIMEOUT_S: Final = 10.0  # deleting what a removed link declared upstream
STOP_TIMEOUT_S: Final = 5.0


@dataclass(frozen=True)
class LinkSpec:
    """What a link runs from: a federated exchange or queue and one of its upstreams."""

    vhost: str
    resource_type: str  # "exchange" or "queue"
    resource: str  # the downstream exchange or queue
    upstream_name: str
    upstream: UpstreamDefinition
    user: str  # who set the upstream: the direct connection's user

    @property
    def upstream_resource(self) -> str:
        """The upstream exchange or queue: the upstream's `exchange`/`queue`, else the
        same name as downstream."""
        named = self.upstream.exchange if self.resource_type == "exchange" else self.upstream.queue
        return named or self.resource

    @property
    def link_name(self) -> str:
        """Unique in the vhost, for `Broker.links`."""
        return f"{self.upstream_name}/{self.resource_type}/{self.resource}"


@dataclass(frozen=True)
class LinkEnvironment:
    broker: Broker
    direct: DirectConnector | None  # this broker's direct connections
    node: str  # this broker's name in queue names and x-bound-from


class FederationLink:
    """A running link; `start()` it, `stop()` it. Event-loop thread only."""

    kind = FEDERATION

    def __init__(self, spec: LinkSpec, env: LinkEnvironment) -> None:
        self.spec = spec
        self.env = env
        self.vhost = spec.vhost
        self.name = spec.link_name
        self.status_text = "starting"  # RabbitMQ's link status: starting, running, error
        self.error = ""
        self.transferred = 0
        self.changed_ms = _now_ms()
        self._paused = False
        self._uri_index = 0
        self.uri_shown = without_credentials(spec.upstream.uris[0])
        self._task: asyncio.Task[None] | None = None
        self._session_task: asyncio.Future[None] | None = None
        self._restarting = False
        self._wake = asyncio.Event()
        self._unconfirmed: deque[tuple[int, int]] = deque()  # (publish seq, upstream tag)
        self.local_connection = ""
        self._hops: tuple[bytes, ...] = ()
        self._publish_ack_tag = 0
        self._publish_acker: asyncio.Future[None] | None = None

    # -- the Link view (streamq.broker.links) ----------------------------------------------

    @property
    def state(self) -> str:
        if self._paused:
            return "paused"
        return {"running": "running", "error": "terminated"}.get(self.status_text, "starting")

    def status(self) -> dict[str, object]:
        spec = self.spec
        kind = spec.resource_type
        out: dict[str, object] = {
            "node": self.env.node,
            kind: spec.resource,
            f"upstream_{kind}": spec.upstream_resource,
            "type": kind,
            "vhost": spec.vhost,
            "upstream": spec.upstream_name,
            "id": self.name,
            "name": self.name,
            "status": "paused" if self._paused else self.status_text,
            "local_connection": self.local_connection,
            "uri": self.uri_shown,
            "timestamp": _timestamp(self.changed_ms),
            "transferred": self.transferred,
        }
        if self.error:
            out["error"] = self.error
        return out

    def pause(self) -> None:
        self._paused = True
        self._set_status("starting", "")
        self._restart_session()

    def resume(self) -> None:
        self._paused = False
        self._wake.set()

    def restart(self) -> None:
        self._restart_session()

    # -- life ------------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self.name)

    async def stop(self, *, cleanup: bool = False) -> None:
        """Stop the link; with `cleanup`, delete what it declared upstream (its policy or
        upstream is gone, as RabbitMQ does unless resource-cleanup-mode is never)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(task, STOP_TIMEOUT_S)
        if cleanup and self.spec.upstream.resource_cleanup_mode != "never":
            try:
                await asyncio.wait_for(self._cleanup_upstream(), CLEANUP_TIMEOUT_S)
            except (AmqpConnectionError, OSError, UriInvalid, TimeoutError) as exc:
                logger.warning("federation link %s: upstream cleanup failed: %s", self.name, exc)

    async def _run(self) -> None:
        while True:
            if self._paused:
                self._wake.clear()
                await self._wake.wait()
                continue
            self._set_status("starting", self.error)
            session = asyncio.ensure_future(self._session())
            self._session_task = session
            try:
                await session
            except asyncio.CancelledError:
                if not self._restarting:
                    raise  # stopped
                self._restarting = False
                continue
            except (AmqpConnectionError, OSError, UriInvalid, TimeoutError, ValueError) as exc:
                self._set_status("error", _describe(exc))
                logger.info("federation link %s: %s", self.name, self.error)
            finally:
                self._session_task = None
            self._uri_index += 1  # the next attempt tries the next URI
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.spec.upstream.reconnect_delay_s)

    def _restart_session(self) -> None:
        """End the current session; the loop starts the next at once (or waits, paused)."""
        self._wake.set()
        session = self._session_task
        if session is not None and not session.done():
            self._restarting = True
            session.cancel()

    def _set_status(self, status: str, error: str) -> None:
        if (status, error) != (self.status_text, self.error):
            self.changed_ms = _now_ms()
        self.status_text = status
        self.error = error

    # -- a session -------------------------------------------------------------------------

    def upstream_uri(self) -> AmqpUri:
        uris = self.spec.upstream.uris
        text = uris[self._uri_index % len(uris)]
        self.uri_shown = without_credentials(text)
        kind, name = self.spec.resource_type, self.spec.upstream_resource
        # This session's x-received-from entry, encoded once: (not redelivered, redelivered).
        self._hops = tuple(
            encoded_hop(received_from_entry(self.uri_shown, kind, name, redelivered))
            for redelivered in (False, True)
        )
        return parse_uri(text)

    async def connect(self) -> tuple[Connection, Connection]:
        """The upstream connection and this broker's (direct). Raises
        AmqpConnectionError, UriInvalid."""
        uri = self.current_uri = self.upstream_uri()
        self._unconfirmed.clear()
        self._publish_acker = None  # a previous session's, if any, acks on its own channel
        label = f"Federation link (upstream) {self.spec.vhost}/{self.name}"
        upstream = await Connection.connect(uri, name=label)
        try:
            local = dataclasses.replace(
                parse_uri("amqp:///" + quote_vhost(self.spec.vhost)), username=self.spec.user
            )
            name = f"Federation link (downstream) {self.spec.vhost}/{self.name}"
            downstream = await Connection.connect(local, name=name, direct=self.env.direct)
        except BaseException:
            await upstream.close()
            raise
        self.local_connection = name
        return upstream, downstream

    async def serve(
        self, upstream: Connection, downstream: Connection, ends: list[asyncio.Future[None]]
    ) -> None:
        """Running until a connection of the session closes or one of `ends` (its
        channels, its tasks) is done; raises its error."""
        self._set_status("running", "")
        waits: list[asyncio.Future[None]] = [upstream.closed, downstream.closed, *ends]
        done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for future in done:
            error = future.exception()
            if error is not None:
                raise error
        raise AmqpConnectionError("a connection of the link closed")

    def settle_setup(self, down: Channel, up: Channel) -> None:
        """Publisher confirms from `down` settle deliveries on `up` (on-confirm)."""
        self._unconfirmed.clear()

        def on_confirm(seq: int, multiple: bool, ack: bool) -> None:
            self._on_confirm(up, seq, multiple, ack)

        down.on_confirm = on_confirm

    def forward(
        self,
        deliveries: list[Delivery],
        up: Channel,
        down: Channel,
        target: tuple[str, str] | None,
        max_hops: int | None,
    ) -> None:
        """Publish each delivery downstream, to `target` (exchange, routing key) or
        else with its own exchange and key, with this hop in `x-received-from`, and
        settle it upstream by the ack mode. Messages past `max-hops` are dropped (acked)."""
        mode = self.spec.upstream.ack_mode
        kind = self.spec.resource_type
        published_tag = 0
        for d in deliveries:
            raw = self._republished(d, kind, max_hops)
            if raw is None:
                if mode != "no-ack":
                    up.ack(d.delivery_tag)
                continue
            exchange, key = target if target is not None else (self.spec.resource, d.routing_key)
            try:
                seq = down.publish(exchange, key, raw, d.body)
            except AmqpConnectionError:
                return  # the session ends; the upstream delivers the rest again
            except ValueError as exc:  # a name or properties this broker cannot take
                logger.warning("federation link %s: dropped a message: %s", self.name, exc)
                if mode != "no-ack":
                    up.ack(d.delivery_tag)
                continue
            self.transferred += 1
            if mode == "on-confirm":
                self._unconfirmed.append((seq, d.delivery_tag))
            elif mode == "on-publish":
                published_tag = d.delivery_tag
        if published_tag:
            self._ack_once_written(up, down, published_tag)

    def _ack_once_written(self, up: Channel, down: Channel, tag: int) -> None:
        """on-publish: ack up to `tag` once the downstream connection takes more (not
        blocked, its write buffer drained), so that what is in flight stays within the
        upstream's prefetch even while this broker holds publishers back."""
        self._publish_ack_tag = tag
        if self._publish_acker is None or self._publish_acker.done():
            self._publish_acker = asyncio.ensure_future(self._ack_when_writable(up, down))

    async def _ack_when_writable(self, up: Channel, down: Channel) -> None:
        with contextlib.suppress(AmqpConnectionError):  # the session ends with it
            await down.writable()
            # Every earlier delivery of this channel is published or was acked already.
            up.ack(self._publish_ack_tag, multiple=True)

    def _republished(self, d: Delivery, kind: str, max_hops: int | None) -> bytes | None:
        """The delivery's properties with this hop added; None: drop it."""
        # Hot path: a message without headers has made no hop yet; splice ours in.
        fast = splice_received_from(d.properties, self._hops[d.redelivered])
        if fast is not None:
            return fast
        try:
            properties = codec.decode_properties(d.properties)
        except AMQPSyntaxError:
            logger.warning("federation link %s: dropped a message with bad properties", self.name)
            return None
        if max_hops is not None and not should_forward(properties.headers, max_hops):
            return None
        if not self.spec.upstream.trust_user_id and properties.user_id is not None:
            # The downstream connection's user could not publish another's user-id.
            properties = dataclasses.replace(properties, user_id=None)
        entry = received_from_entry(
            self.uri_shown, kind, self.spec.upstream_resource, d.redelivered
        )
        try:
            return add_received_from(properties, entry)
        except ValueError:
            return None

    def _on_confirm(self, up: Channel, seq: int, multiple: bool, ack: bool) -> None:
        pending = self._unconfirmed
        settled: list[int] = []
        if multiple:
            while pending and pending[0][0] <= seq:
                settled.append(pending.popleft()[1])
        else:
            for index, (s, tag) in enumerate(pending):
                if s == seq:
                    del pending[index]
                    settled.append(tag)
                    break
        for tag in settled:
            if ack:
                up.ack(tag)
            else:
                up.nack(tag, requeue=True)

    # -- per kind ----------------------------------------------------------------------------

    async def _session(self) -> None:
        raise NotImplementedError

    async def _cleanup_upstream(self) -> None:
        """Delete what the link declared upstream (nothing by default)."""


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, TimeoutError):
        return "timed out"
    return text


def _now_ms() -> int:
    return int(time.time() * 1000)


def _timestamp(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))
