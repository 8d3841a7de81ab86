"""systemd's service notifications (sd_notify(3)), sent over $NOTIFY_SOCKET directly.

Owns what a `streamq serve` process run by systemd with `Type=notify` tells the service
manager: READY=1 once every listener accepts (a cluster follower: once it forwards to
its leader), STATUS= lines saying what it does (recovering the data directory, serving
with its counts, following a leader, stopping), WATCHDOG=1 every half of WATCHDOG_USEC
while the event loop turns (a hung loop misses its pings and systemd restarts the
service), and STOPPING=1 when shutdown begins. Each message is one datagram to the unix
socket NOTIFY_SOCKET names: a path, or with a leading '@' a name in Linux's abstract
namespace. No library: the protocol is that datagram.

Without NOTIFY_SOCKET every call does nothing. A failed send is logged at debug level and
otherwise ignored: systemd's absence or restart never stops the broker. The notifier is
one per process (`notifier()`), as the environment it is read from.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import Final

logger = logging.getLogger(__name__)

STATUS_REFRESH_S: Final = 5.0  # how often a serving STATUS= line is brought up to date
STATUS_BYTES_MAX: Final = 1024  # a STATUS= line is cut to this (systemctl shows one line)


def socket_address(value: str) -> str | bytes | None:
    """NOTIFY_SOCKET's address: a path, or bytes starting with NUL for an abstract name
    ('@' in the variable); None for an unset or unusable value."""
    if value.startswith("@") and len(value) > 1:
        return b"\0" + value[1:].encode()
    if value.startswith("/"):
        return value
    return None  # systemd only ever sets an absolute path or an abstract name


def watchdog_interval_s(environ: Mapping[str, str]) -> float | None:
    """Half of WATCHDOG_USEC, when it is set for this process (WATCHDOG_PID, if set,
    names it); None: no watchdog."""
    usec = environ.get("WATCHDOG_USEC", "")
    pid = environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if pid and pid != str(os.getpid()):
        return None
    return int(usec) / 2 / 1_000_000


class Notifier:
    """Sends notifications to `address` (None: nowhere); pings the watchdog every
    `watchdog_s` once `start()`ed."""

    def __init__(self, address: str | bytes | None, watchdog_s: float | None = None) -> None:
        self.address = address
        self.watchdog_s = watchdog_s if address is not None else None
        self._socket: socket.socket | None = None
        self._status = ""
        self._source: Callable[[], str] | None = None
        self._task: asyncio.Task[None] | None = None
        self._failed_logged = False

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> Notifier:
        address = socket_address(environ.get("NOTIFY_SOCKET", ""))
        return cls(address, watchdog_interval_s(environ))

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *fields: str) -> bool:
        """One datagram of `fields` ("READY=1", ...), a line each. True if it was sent."""
        if self.address is None:
            return False
        try:
            if self._socket is None:
                self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._socket.setblocking(False)  # the event loop's thread never waits
            self._socket.sendto("\n".join(fields).encode(), self.address)
        except OSError as exc:
            if not self._failed_logged:  # once: a missing manager would log at each ping
                logger.debug("sd_notify to %r failed: %s", self.address, exc)
                self._failed_logged = True
            return False
        return True

    def status(self, text: str) -> None:
        """STATUS=`text`, if it differs from the last one sent."""
        text = text.replace("\n", " ")[:STATUS_BYTES_MAX]
        if text != self._status and self.send(f"STATUS={text}"):
            self._status = text

    def ready(self, status: str, source: Callable[[], str] | None = None) -> None:
        """READY=1 with STATUS=`status`; `source`, if given, gives the status from now on
        (asked every STATUS_REFRESH_S)."""
        self._source = source
        status = status.replace("\n", " ")[:STATUS_BYTES_MAX]
        if self.send("READY=1", f"STATUS={status}"):
            self._status = status

    def serving_ended(self) -> None:
        """What `ready`'s source described is gone (a leader stepping down)."""
        self._source = None

    def stopping(self) -> None:
        self._source = None
        self.send("STOPPING=1", "STATUS=stopping")

    def start(self) -> None:
        """Ping the watchdog and refresh the status on a task of the running loop."""
        if self.address is not None and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._tick())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    async def _tick(self) -> None:
        """WATCHDOG=1 every `watchdog_s`, and the status refreshed every
        STATUS_REFRESH_S, each on its own schedule."""
        now_s = time.monotonic()
        next_ping_s = now_s if self.watchdog_s is not None else float("inf")
        next_status_s = now_s + STATUS_REFRESH_S
        while True:
            now_s = time.monotonic()
            if now_s >= next_ping_s and self.watchdog_s is not None:
                self.send("WATCHDOG=1")
                next_ping_s = now_s + self.watchdog_s
            if now_s >= next_status_s:
                next_status_s = now_s + STATUS_REFRESH_S
                self._refresh_status()
            await asyncio.sleep(max(min(next_ping_s, next_status_s) - time.monotonic(), 0))

    def _refresh_status(self) -> None:
        if self._source is None:
            return
        try:
            self.status(self._source())
        except Exception:  # a status is never worth stopping the watchdog for
            logger.exception("sd_notify: the status could not be made")


@functools.cache
def notifier() -> Notifier:
    """This process's notifier, made from its environment at the first call."""
    return Notifier.from_environment()
