"""When an MQTT session reads its socket: the holds on reading, and their release.

Owns `ReadGate`, one per `MqttSession`: reading stops while too many acknowledgements
of publishes wait for the disk (`unconfirmed`, UNCONFIRMED_MAX), while a resource alarm
lasts for a client that publishes (`alarm`), and after a read that made queues dirty
until their drain has run (`hold_for_drain`), and goes on when the last hold is
released. The transport is the session's; the gate knows no packet.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from mqtt_gateway.session import MqttSession

UNCONFIRMED_MAX: Final = 4096  # publishes read whose PUBACK or PUBREC waits for the disk
DRAIN_HOLD_TURNS_MAX: Final = 4


class ReadGate:
    """The holds on one session's reading (module docstring)."""

    def __init__(self, session: MqttSession) -> None:
        self._session = session
        self.unconfirmed = 0  # publishes whose acknowledgement waits for the disk
        self.acks_held = False  # too many acknowledgements wait for the disk
        self.alarm = False  # not read while a resource alarm lasts
        self.drain = False  # not read until the pending drain ran (`hold_for_drain`)

    def owe_ack(self, count: int = 1) -> None:
        """`count` more publishes' acknowledgements wait for the disk."""
        self.unconfirmed += count
        if self.unconfirmed >= UNCONFIRMED_MAX and not self.acks_held:
            self.acks_held = True
            self._pause()

    def acks_sent(self, count: int) -> None:
        """`count` of the owed acknowledgements went out."""
        self.unconfirmed -= count
        if self.acks_held and self.unconfirmed < UNCONFIRMED_MAX:
            self.acks_held = False
            self._read_if_free()

    def hold_for_drain(self) -> None:
        """Read no more until the drain that delivers what this read routed has run.

        The event loop calls `data_received` back to back while a fast publisher keeps
        its socket readable (libuv reads up to 32 times per poll), and the drain waits
        for the loop's next turn: one QoS 0 publisher starved its subscriber (2,259
        deliveries in 10 s while 226k publishes were read). The drain was scheduled
        (`call_soon`) when this read made a queue dirty, so a `call_soon` now runs after
        it: publishing and delivering alternate read by read, as the AMQP gateway's
        `hold_reading` makes them. A drain delivers at most 4,096 per queue and a read
        holds up to about 9,000 small publishes, so the hold lasts while queues stay
        dirty, up to DRAIN_HOLD_TURNS_MAX drains."""
        if self.drain or not self._pause():
            return
        self.drain = True
        asyncio.get_running_loop().call_soon(self._release_drain_hold, 1)

    def _release_drain_hold(self, turns: int) -> None:
        vhost = self._session.vhost
        if vhost is not None and vhost.dirty and turns < DRAIN_HOLD_TURNS_MAX:
            asyncio.get_running_loop().call_soon(self._release_drain_hold, turns + 1)
            return
        self.drain = False
        self._read_if_free()

    def hold_for_alarm(self, hold: bool) -> None:
        """Stop (or go on) reading while a resource alarm lasts; the keep-alive does not
        count the time it is held (the client's PINGREQs wait unread)."""
        s = self._session
        if hold == self.alarm or s.transport is None or s.closed:
            return
        self.alarm = hold
        if hold:
            s.transport.pause_reading()
        else:
            s.last_read_s = time.monotonic()
            self._read_if_free()

    def _pause(self) -> bool:
        s = self._session
        if s.transport is None or s.closed:
            return False
        s.transport.pause_reading()
        return True

    def _read_if_free(self) -> None:
        """Resume reading unless a hold remains."""
        if self.acks_held or self.alarm or self.drain:
            return
        s = self._session
        if s.transport is not None and not s.closed:
            s.transport.resume_reading()
