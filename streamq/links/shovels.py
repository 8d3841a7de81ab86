"""A dynamic shovel at run time: RabbitMQ's shovel worker, as the management API sees it.

Owns `Shovel`, the `Link` (streamq/broker/links.py) of one `shovel` parameter: a task that
opens a session (shovel_session.py), waits for it to fail or finish, and opens the next
after `reconnect-delay`, with its state ("starting", "running", "terminated", "paused"),
the last error, the count of messages moved and their rate. It must not validate
parameters (link_definitions.py) nor start or stop itself on parameter changes
(supervisor.py).

As RabbitMQ: a failure shows as "terminated" with its reason until the next attempt, which
shows as "starting"; a reconnect-delay of 0 means no further attempt. Reaching
src-delete-after stops the shovel for good and `on_done` deletes its parameter.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Final

from streamq.broker.link_definitions import ShovelDefinition, shovel_ends
from streamq.links.amqp.client import AmqpConnectionError
from streamq.links.shovel_endpoints import DestinationError, Opener, is_http
from streamq.links.shovel_session import DONE, ShovelSession

logger = logging.getLogger(__name__)

RATE_WINDOW_S: Final = 5.0  # the transfer rate is the average over this window
STOP_TIMEOUT_S: Final = 10.0


class Shovel:
    """One running shovel (a `Link` of kind "shovel")."""

    kind: Final = "shovel"

    def __init__(
        self,
        vhost: str,
        name: str,
        value: object,
        definition: ShovelDefinition,
        opener: Opener,
        node: str,
        on_done: Callable[[Shovel], Awaitable[None]],
    ) -> None:
        self.vhost = vhost
        self.name = name
        self.value = value  # the parameter as given: an unchanged PUT keeps the shovel
        self.definition = definition
        self.state = "starting"
        self.error = ""
        self.transferred = 0
        self._opener = opener
        self._node = node
        self._on_done = on_done
        self._since = time.time()  # the state's start, RabbitMQ's `timestamp`
        self._paused = False
        self._wake = asyncio.Event()  # pause, resume or restart during a delay
        self._task: asyncio.Task[None] | None = None
        self._session: ShovelSession | None = None
        self._session_task: asyncio.Task[str] | None = None
        self._rate_samples: list[tuple[float, int]] = []

    def start(self, after: Awaitable[None] | None = None) -> None:
        """Run from now on; after `after` (the shovel this one replaces stopping)."""
        self._task = asyncio.get_running_loop().create_task(self._run(after))

    async def stop(self) -> None:
        """Stop for good, closing both ends (unacked messages go back to the source)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=STOP_TIMEOUT_S)
        self._set_state("terminated")

    def pause(self) -> None:
        """LavinMQ's pause: close the session and wait for `resume`."""
        self._paused = True
        self._interrupt()

    def resume(self) -> None:
        self._paused = False
        self._interrupt()

    def restart(self) -> None:
        """RabbitMQ's restart: a new session now, without the reconnect delay."""
        self._interrupt()

    def _interrupt(self) -> None:
        self._wake.set()
        if self._session_task is not None:
            self._session_task.cancel()

    def _set_state(self, state: str) -> None:
        if state != self.state:
            self.state = state
            self._since = time.time()

    async def _run(self, after: Awaitable[None] | None) -> None:
        if after is not None:
            await after
        while True:
            self._wake.clear()
            if self._paused:
                self._set_state("paused")
                await self._wake.wait()
                continue
            self._set_state("starting")
            outcome = await self._run_session()
            if outcome == DONE:
                self._set_state("terminated")
                await self._on_done(self)
                return
            if outcome is None:
                continue  # interrupted: paused, resumed or restarted
            # Logged when the reason changes, not at every attempt of a long outage.
            level = logging.DEBUG if outcome == self.error else logging.WARNING
            logger.log(level, "shovel %s/%s: %s", self.vhost, self.name, outcome)
            self.error = outcome
            self._set_state("terminated")
            if self.definition.reconnect_delay_s <= 0:
                return  # RabbitMQ: a reconnect-delay of 0 means never again
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.definition.reconnect_delay_s)

    async def _run_session(self) -> str | None:
        """DONE, None when interrupted, or the reason the session ended."""
        session = ShovelSession(self.definition, self.vhost, self.name, self._node, self._count)
        self._session = session
        self._session_task = asyncio.get_running_loop().create_task(
            session.run(self._opener, self._running)
        )
        try:
            return await self._session_task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # stop(): not an interruption
            return None
        except (AmqpConnectionError, DestinationError, OSError) as exc:
            return str(exc) or type(exc).__name__
        except Exception as exc:  # a bug must not stop the broker: logged, retried later
            logger.exception("shovel %s/%s failed", self.vhost, self.name)
            return f"internal error: {exc!r}"
        finally:
            self._session_task = None
            await session.close()

    def _running(self) -> None:
        self.error = ""
        self._set_state("running")

    def _count(self, count: int) -> None:
        self.transferred += count

    def rate(self) -> float:
        """Messages per second over the last RATE_WINDOW_S, or since the previous status
        if that is older (sampled at each status)."""
        now = time.monotonic()
        # The last sample is kept even when older than the window: statuses read less
        # often than every RATE_WINDOW_S still get the rate since the previous read.
        recent = [s for s in self._rate_samples if now - s[0] <= RATE_WINDOW_S]
        samples = recent or self._rate_samples[-1:]
        samples.append((now, self.transferred))
        self._rate_samples = samples
        first_s, first_count = samples[0]
        return 0.0 if now - first_s <= 0 else (self.transferred - first_count) / (now - first_s)

    def status(self) -> dict[str, object]:
        """RabbitMQ's /api/shovels entry, with LavinMQ's message_count and streamq's
        error, transferred and rate."""
        definition = self.definition
        status: dict[str, object] = {
            "node": self._node,
            "timestamp": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self._since)),
            "name": self.name,
            "vhost": self.vhost,
            "type": "dynamic",
            "state": self.state,
            "src_protocol": "amqp091",
            "dest_protocol": "http" if is_http(definition.dest_uris[0]) else "amqp091",
            "blocked_status": "blocked" if self._blocked() else "running",
            "error": self.error,
            "transferred": self.transferred,
            "message_count": self.transferred,
            "transferred_details": {"rate": round(self.rate(), 1)},
        }
        status.update(shovel_ends(definition))
        if self.state == "terminated" and self.error:
            status["reason"] = self.error
        return status

    def _blocked(self) -> bool:
        return self._session is not None and self.state == "running" and self._session.blocked
