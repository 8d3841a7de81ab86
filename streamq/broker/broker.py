"""The broker: its data directory, users and vhosts.

Owns what one broker process holds across vhosts: the fsync thread they share, the user
store and the vhost registry. It opens and closes them in order; it does not listen on
sockets (the gateway does).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import time
from collections.abc import Callable
from typing import Final, ParamSpec, TypeVar

from streamq.broker.account_values import NO_METADATA, VHostMetadata
from streamq.broker.accounts import AccountStore, FirstUser, VHostNotFound
from streamq.broker.clients import Client, PropertiesJson
from streamq.broker.cluster_view import ClusterView
from streamq.broker.connection_tracking import ConnectionTracking
from streamq.broker.errors import BrokerError, NotAllowed
from streamq.broker.links import Link, LinkKey
from streamq.broker.parameters import ParameterListener
from streamq.broker.resources import ResourceLimits, ResourceMonitor
from streamq.broker.sampler import Sampler
from streamq.broker.vhost import VHost
from streamq.log import files
from streamq.log.errors import LogError
from streamq.log.files import fsync_directory
from streamq.log.syncer import Syncer
from streamq.log_fields import EXCEPTION, VHOST

logger = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

VHOSTS_DIR: Final = "vhosts"
DELETED_SUFFIX: Final = ".deleted"  # a deleted vhost's directory, renamed before removal
# A deleted vhost's connections are closed; this long at most they may take to go away.
CLIENTS_CLOSE_TIMEOUT_S: Final = 5.0


class Broker:
    def __init__(
        self,
        data_dir: str,
        limits: ResourceLimits | None = None,
        *,
        direct_io: bool = True,
        first_user: FirstUser | None = None,
        failover: bool = False,
    ) -> None:
        """Open the data directory. `first_user`: a fresh directory's user instead of
        guest/guest (see `AccountStore.open`). `failover`: this node was just promoted
        to cluster leader; every message restored into a classic queue comes back
        flagged redelivered (see `VHost`)."""
        self.data_dir = data_dir
        self.failover = failover
        self.syncer = Syncer(direct_io=direct_io)
        self.resources = ResourceMonitor(data_dir, limits or ResourceLimits.defaults())
        self.accounts = AccountStore.open(data_dir, first_user)
        # Open connections by vhost and user, for the vhost and user limits.
        self.tracking = ConnectionTracking(self.accounts)
        self.vhosts: dict[str, VHost] = {}
        self.failed_vhosts: dict[str, str] = {}  # name: why it could not be opened
        # Client connections by name (the AMQP gateway registers them, the management
        # API lists and closes them), and the gateway's properties <-> JSON translation.
        self.clients: dict[str, Client] = {}
        self.properties_json: PropertiesJson | None = None
        # Message rates and connections' byte rates, ticked by the gateway's timer.
        self.stats_sampler = Sampler(clients=self.clients)
        # Called with each vhost created at run time (the AMQP gateway hooks it up).
        self.vhost_listeners: list[Callable[[VHost], None]] = []
        self.started_s = time.monotonic()
        # (protocol, address, port) of each listener, as the serving process records them.
        self.listeners: list[tuple[str, str, int]] = []
        # The certificate and CA files of the TLS listeners ("": none), for the
        # certificate-expiration health check; the serving process sets them.
        self.tls_files: tuple[str, str] = ("", "")
        # The links runtime hears of each runtime parameter change through these (and of
        # every parameter there is when it appends itself), and registers what it runs
        # in `links` for the management API.
        self.parameter_listeners = ParameterListeners(self)
        self.links: dict[LinkKey, Link] = {}
        self.cluster: ClusterView | None = None  # set by streamq.cluster on a leader
        _remove_deleted_vhost_dirs(os.path.join(data_dir, VHOSTS_DIR))
        # Every vhost is restored before the broker accepts a connection (the caller
        # starts listening only after this returns).
        for name in self.accounts.list_vhosts():
            self.add_vhost(name)

    def vhost_directory(self, name: str) -> str:
        # As LavinMQ, a vhost's directory is named by the sha1 of its name.
        return os.path.join(self.data_dir, VHOSTS_DIR, hashlib.sha1(name.encode()).hexdigest())

    def add_vhost(self, name: str) -> VHost | None:
        try:
            vhost = VHost(name, self.vhost_directory(name), self.syncer, failover=self.failover)
        except (BrokerError, LogError, OSError) as exc:
            # Only this vhost fails: its clients are refused with the reason; the others
            # run. Its files are left as they are for inspection.
            logger.error(
                "vhost %s could not be opened: %s", name, exc, extra={VHOST: name, EXCEPTION: exc}
            )
            self.failed_vhosts[name] = str(exc)
            return None
        self._opened(vhost)
        return vhost

    def _opened(self, vhost: VHost) -> None:
        vhost.log.limit_recent(self.resources.limits.log_tail_bytes_max)
        vhost.parameters.notify = self.parameter_changed
        vhost.default_queue_type = self.accounts.vhost_metadata(vhost.name).default_queue_type
        self.vhosts[vhost.name] = vhost
        logger.info("vhost %s: started", vhost.name, extra={VHOST: vhost.name})

    def parameter_changed(self, vhost: str, component: str, name: str, value: object) -> None:
        """Announce a runtime parameter change (value None: deleted) to every listener.
        A listener that raises is logged; the change stands and the others hear of it."""
        for listener in list(self.parameter_listeners):
            try:
                listener(vhost, component, name, value)
            except Exception:
                logger.exception("parameter listener failed on %s/%s/%s", vhost, component, name)

    def vhost(self, name: str) -> VHost:
        found = self.vhosts.get(name)
        if found is None:
            if name in self.failed_vhosts:
                raise NotAllowed(f"vhost {name} is unavailable: {self.failed_vhosts[name]}")
            raise NotAllowed(f"vhost {name} not found")
        return found

    async def create_vhost(self, name: str, metadata: VHostMetadata = NO_METADATA) -> VHost | None:
        """Add vhost `name` to the accounts and open it (from the event loop): on return it
        accepts connections. The accounts file and the vhost's directory are fsynced first;
        the blocking work runs in a worker thread.

        Raises VHostExists, AccountValueInvalid, OSError. Returns None if the vhost is
        defined but its files could not be opened (it is then in `failed_vhosts`).
        """
        await self.change_durably(self.accounts.add_vhost, name, metadata)
        directory = self.vhost_directory(name)
        try:
            vhost = await self.change_durably(VHost, name, directory, self.syncer)
        except (BrokerError, LogError, OSError) as exc:
            logger.error(
                "vhost %s could not be opened: %s", name, exc, extra={VHOST: name, EXCEPTION: exc}
            )
            self.failed_vhosts[name] = str(exc)
            return None
        self._opened(vhost)
        for listener in self.vhost_listeners:
            listener(vhost)
        return vhost

    async def delete_vhost(self, name: str) -> None:
        """Delete vhost `name` (from the event loop): close its connections (320
        CONNECTION_FORCED, as RabbitMQ), close it, then delete its definition, the
        permissions on it and its data. Durable on return: the data directory is renamed
        away (directory fsynced) before the accounts file changes, so a crash leaves either
        the vhost or nothing of it. Raises VHostNotFound, OSError.
        """
        if not self.accounts.has_vhost(name):
            raise VHostNotFound(name)
        vhost = self.vhosts.pop(name, None)
        self.failed_vhosts.pop(name, None)
        if vhost is not None:
            for parameter in vhost.parameters.list():  # its shovels and links stop first
                self.parameter_changed(name, parameter.component, parameter.name, None)
        await self._close_clients(name, f"vhost '{name}' is deleted")
        if vhost is not None:
            await vhost.aclose()
        await self.change_durably(self._delete_vhost_files, name)

    async def change_durably(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run `fn`, a blocking change that makes its own writes durable (accounts, vhost
        files), in a worker thread, then wait for an empty sync round: on a cluster leader
        the round completes once the replicas have the change too (`Syncer.gate`).
        Raises what `fn` raises, and ReplicationFenced when the node stepped down."""
        result = await asyncio.to_thread(fn, *args, **kwargs)
        await asyncio.wrap_future(self.syncer.barrier())
        return result

    async def _close_clients(self, vhost: str, reason: str) -> None:
        for client in [c for c in self.clients.values() if c.vhost == vhost]:
            client.close(reason)
        deadline_s = time.monotonic() + CLIENTS_CLOSE_TIMEOUT_S
        while any(c.vhost == vhost for c in self.clients.values()):
            if time.monotonic() > deadline_s:
                logger.warning("vhost %s: connections still open after close", vhost)
                return
            await asyncio.sleep(0.01)

    def _delete_vhost_files(self, name: str) -> None:
        directory = self.vhost_directory(name)
        trash = directory + DELETED_SUFFIX
        if os.path.isdir(directory):
            files.replace(directory, trash)
            fsync_directory(os.path.dirname(directory))
        self.accounts.delete_vhost(name)
        with contextlib.suppress(OSError):
            files.remove_tree(trash)

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


class ParameterListeners(list[ParameterListener]):
    """`Broker.parameter_listeners`: appending a listener first calls it with every
    runtime parameter there is (the links runtime starts from them), then it hears of
    each change as it happens."""

    def __init__(self, broker: Broker) -> None:
        super().__init__()
        self._broker = broker

    def append(self, listener: ParameterListener) -> None:
        for vhost in list(self._broker.vhosts.values()):
            for parameter in vhost.parameters.list():
                listener(vhost.name, parameter.component, parameter.name, parameter.value)
        super().append(listener)


def _remove_deleted_vhost_dirs(vhosts_dir: str) -> None:
    """Finish deletions a crash interrupted: directories renamed away by `delete_vhost`."""
    try:
        names = os.listdir(vhosts_dir)
    except FileNotFoundError:
        return
    for entry in names:
        if entry.endswith(DELETED_SUFFIX):
            with contextlib.suppress(OSError):
                files.remove_tree(os.path.join(vhosts_dir, entry))
