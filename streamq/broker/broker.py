"""The broker: its data directory, users and vhosts.

Owns what one broker process holds across vhosts: the fsync thread they share, the user
store and the vhost registry. It opens and closes them in order; it does not listen on
sockets (the gateway does).
"""

from __future__ import annotations

import hashlib
import logging
import os

from streamq.broker.accounts import AccountStore
from streamq.broker.errors import BrokerError, NotAllowed
from streamq.broker.resources import ResourceLimits, ResourceMonitor
from streamq.broker.vhost import VHost
from streamq.log.errors import LogError
from streamq.log.syncer import Syncer

logger = logging.getLogger(__name__)


class Broker:
    def __init__(self, data_dir: str, limits: ResourceLimits | None = None) -> None:
        self.data_dir = data_dir
        self.syncer = Syncer()
        self.resources = ResourceMonitor(data_dir, limits or ResourceLimits.defaults())
        self.accounts = AccountStore.open(data_dir)
        self.vhosts: dict[str, VHost] = {}
        self.failed_vhosts: dict[str, str] = {}  # name: why it could not be opened
        # Every vhost is restored before the broker accepts a connection (the caller
        # starts listening only after this returns).
        for name in self.accounts.list_vhosts():
            self.add_vhost(name)

    def add_vhost(self, name: str) -> VHost | None:
        # As LavinMQ, a vhost's directory is named by the sha1 of its name.
        directory = os.path.join(self.data_dir, "vhosts", hashlib.sha1(name.encode()).hexdigest())
        try:
            vhost = VHost(name, directory, self.syncer)
        except (BrokerError, LogError, OSError) as exc:
            # Only this vhost fails: its clients are refused with the reason; the others
            # run. Its files are left as they are for inspection.
            logger.error("vhost %s could not be opened: %s", name, exc)
            self.failed_vhosts[name] = str(exc)
            return None
        self.vhosts[name] = vhost
        return vhost

    def vhost(self, name: str) -> VHost:
        found = self.vhosts.get(name)
        if found is None:
            if name in self.failed_vhosts:
                raise NotAllowed(f"vhost {name} is unavailable: {self.failed_vhosts[name]}")
            raise NotAllowed(f"vhost {name} not found")
        return found

    def close(self) -> None:
        """Close every vhost (fsyncs what they buffered) and stop the fsync thread."""
        try:
            for vhost in self.vhosts.values():
                vhost.close()
        finally:
            self.syncer.close()

    async def aclose(self) -> None:
        """`close()` from the event loop: waits for sync rounds in flight first."""
        try:
            for vhost in self.vhosts.values():
                await vhost.aclose()
        finally:
            self.syncer.close()
