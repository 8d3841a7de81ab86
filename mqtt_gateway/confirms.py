"""The replies of one MQTT connection that wait for the disk, sent once it has them.

Owns `Confirms`, one per `MqttSession`: the replies owed behind a sync round of the
vhost's log (a publish's PUBACK or PUBREC, a run's PUBACKs in one piece, a persistent
session's SUBACK, a PUBCOMP, and any reply asked for after one of them, so that replies
leave in packet order, MQTT-4.6.0-2), and the one task per connection that sends them:
it waits for the round their promise needs (the definitions journal too for a binding;
the PUBREL state first for a QoS 2 delivery's PUBREL, which then settles the delivery),
writes them in order, and parks on a future until more are owed. A task per read cost
15% of the broker's main thread with 100 QoS 1 publishers (docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from mqtt_gateway import qos2_delivery
from mqtt_gateway.codec import ReasonCode
from mqtt_gateway.consumer import MqttConsumer
from streamq.broker.queue import Queue
from streamq.log.errors import LogError

if TYPE_CHECKING:
    from mqtt_gateway.session import MqttSession

logger = logging.getLogger(__name__)

Inflight = tuple[Queue, int, MqttConsumer]
# (packets, how many publishes they acknowledge, the delivery a PUBREL settles).
Owed = tuple[bytes, int, Inflight | None]


class Confirms:
    """The replies of one session waiting for a sync round (module docstring)."""

    __slots__ = ("_idle", "_runner", "_s", "owed", "running", "sync", "sync_all")

    def __init__(self, session: MqttSession) -> None:
        self._s = session
        self.owed: list[Owed] = []  # in the order asked
        self.sync = False  # a reply waits for the message log's round
        self.sync_all = False  # one waits for the definitions too (a binding)
        self.running = False  # the task has replies to send
        self._runner: asyncio.Task[None] | None = None
        self._idle: asyncio.Future[None] | None = None  # where the task waits for work

    def owe(
        self, data: bytes, counted: int, settle: Inflight | None, *, durable: bool,
        definitions: bool,
    ) -> None:  # fmt: skip
        """Send `data` after the round it needs (`durable`: the message log's;
        `definitions`: the definitions journal's too) and the replies owed before it."""
        self.owed.append((data, counted, settle))
        self.sync = self.sync or durable
        self.sync_all = self.sync_all or definitions
        if self.running:
            return  # it sends what is owed before it waits again
        self.running = True
        runner, idle = self._runner, self._idle
        if runner is None or runner.done():
            self._runner = self._s.spawn(self._run())
        elif idle is not None and not idle.done():
            idle.set_result(None)

    async def _run(self) -> None:
        """`_send_owed` whenever replies are owed, for the connection's life."""
        loop = asyncio.get_running_loop()
        while True:  # cancelled with the session's tasks when the connection is lost
            await self._send_owed()
            self._idle = idle = loop.create_future()
            await idle

    async def _send_owed(self) -> None:
        """Send the owed replies once a sync round covers what they promise."""
        s = self._s
        try:
            while self.owed and not s.closed:
                owed, self.owed = self.owed, []
                vhost = s.vhost
                assert vhost is not None
                if any(settle is not None for _data, _counted, settle in owed):
                    # The PUBREL state on disk before the acks (qos2_delivery.py).
                    await s.gateway.flush_stores(vhost)
                    self._settle_released(owed)
                if self.sync_all:
                    self.sync = self.sync_all = False
                    await vhost.sync_all()  # messages, queue journals and definitions
                    await s.gateway.flush_stores(vhost)
                elif self.sync:
                    self.sync = False
                    await vhost.sync()
                    await s.gateway.flush_stores(vhost)
                for data, _counted, _settle in owed:
                    s.write(data)
                s.gate.acks_sent(sum(counted for _data, counted, _settle in owed))
                s.flush()
        except (LogError, OSError) as exc:
            logger.error("message store failed; closing MQTT connection %s: %s", s.peer, exc)
            s.disconnect(ReasonCode.UNSPECIFIED_ERROR)
        finally:
            self.running = False

    def _settle_released(self, owed: list[Owed]) -> None:
        """Settle the PUBREC'd deliveries of `owed` still in the session's `settling`
        (those a release handed to the gateway meanwhile are its to settle)."""
        s = self._s
        released = [held for _data, _counted, held in owed if held is not None]
        keep = []
        for held in s.settling:  # by identity: the tuples `reply` put there
            if any(held is r for r in released):
                qos2_delivery.settle(s, held)
            else:
                keep.append(held)
        s.settling = keep
