"""A cluster node's life: `streamq serve --clustering`.

Owns the order of things, one asyncio task tree per process: lock the data directory,
load the node id, take a lease in etcd (`Membership`), read the cluster secret, register
this node, then loop: follow the elected leader (`following.Following`) while campaigning
when eligible (in the ISR, or the ISR never set, and no `.clustering_syncing` marker);
once elected, stop following, check eligibility again, write the ISR as this node alone,
start recording the data directory (`FileTap`), serve the replication port and run the
broker (`streamq.app.run_broker`) with the replication server as its fsync rounds' gate.

Stepping down (the lease is lost, or may be): fence the replication server first (no
round is released from then on), then close the listeners and clients, then the broker;
stop recording; run the `on_leader_lost` hook; and go on as a follower in the same
process. On SIGTERM a leader closes everything the same way, its last rounds replicated,
then resigns, so that a follower takes over at once rather than after the lease's TTL.

Until this node follows or leads, it listens on no client port: a client is refused
(connection refused) while no leader is known or etcd cannot be reached.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import socket
from typing import Any, Final
from urllib.parse import urlsplit

from streamq.app import ClusterRole, ServeConfig, ServeError, lock_data_dir, run_broker, serve
from streamq.broker.broker import Broker
from streamq.cluster.etcd import Etcd, EtcdError
from streamq.cluster.following import Following
from streamq.cluster.hooks import Hooks
from streamq.cluster.leader import ReplicationServer
from streamq.cluster.link_tls import LinkTls, link_tls
from streamq.cluster.membership import Membership, NodeInfo, load_node_id
from streamq.cluster.sync import SYNCING_MARKER
from streamq.cluster.view import LeaderView
from streamq.log.errors import OutOfSpace
from streamq.log.tap import FileTap, set_tap
from streamq.pidfile import PidfileError, remove_pidfile, write_pidfile
from streamq.sd_notify import notifier
from streamq.tls import TlsContexts

logger = logging.getLogger("streamq")

ETCD_RETRY_S_MIN: Final = 0.5
ETCD_RETRY_S_MAX: Final = 5.0
LEASE_CHECK_S: Final = 0.1  # how often a leader looks at its lease's validity
RECHECK_S: Final = 5.0  # a follower re-reads the leader and ISR at least this often
RESIGN_TIMEOUT_S: Final = 3.0
NODE_ID_RETRY_S: Final = 1.0  # a first start on a full disk tries to write its id again
WILDCARDS: Final = frozenset({"", "0.0.0.0", "::"})


def advertised_uri(config: ServeConfig) -> str:
    """Where the other nodes reach this node's replication port."""
    if config.clustering_advertised_uri:
        return config.clustering_advertised_uri
    return f"tcp://{_host_text(config.clustering_bind)}:{config.clustering_port}"


def node_info(config: ServeConfig, node_id: str) -> NodeInfo:
    """This node as registered in etcd: its client ports at its listeners' address, or
    at the advertised URI's host where a listener binds every address."""
    advertised_host = urlsplit(advertised_uri(config)).hostname or "127.0.0.1"
    http_bind = config.bind if config.http_bind is None else config.http_bind
    mqtt_bind = config.bind if config.mqtt_bind is None else config.mqtt_bind

    def address(bind: str, port: int) -> str:
        host = advertised_host if bind in WILDCARDS else bind
        return f"{_host_text(host)}:{port}" if port >= 0 else ""

    return NodeInfo(
        node_id=node_id,
        advertised_uri=advertised_uri(config),
        amqp=address(config.bind, config.amqp_port),
        http=address(http_bind, config.http_port),
        amqps=address(config.bind, config.amqps_port),
        https=address(http_bind, config.https_port),
        stream=address(config.bind, config.stream_port),
        stream_advertised=stream_advertised(config),
        mqtt=address(mqtt_bind, config.mqtt_port),
        mqtts=address(mqtt_bind, config.mqtts_port),
    )


def stream_advertised(config: ServeConfig) -> str:
    """What Metadata tells clients of this node's stream port ("" without one): the
    stream gateway's advertised host and port (the host name and the listener's port by
    default, as RabbitMQ)."""
    if config.stream_port < 0:
        return ""
    host = config.stream_advertised_host or socket.gethostname()
    return f"{_host_text(host)}:{config.stream_advertised_port or config.stream_port}"


def _host_text(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class Node:
    """One cluster node, run by `run()` until `stop` is set."""

    def __init__(self, config: ServeConfig, stop: asyncio.Event, tls: list[TlsContexts]):
        self.config = config
        self.stop = stop
        self.tls = tls  # the running leader's TLS contexts, for SIGHUP
        self.node_id = ""
        self.secret = ""
        self.following: Following | None = None
        self._etcd: Etcd | None = None
        self._hooks: Hooks | None = None
        self._link_tls: LinkTls | None = None

    async def run(self) -> None:
        """Raises ServeError if the node cannot start (clustering TLS settings, data
        directory, pidfile)."""
        self._link_tls = link_tls(self.config)
        if self._link_tls is not None:
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self._reload_tls)
        lock_fd = lock_data_dir(self.config.data_dir)
        try:
            if self.config.pidfile:
                try:
                    write_pidfile(self.config.pidfile)
                except PidfileError as exc:
                    raise ServeError(str(exc)) from exc
            self.node_id = await self._load_node_id()
            self._hooks = Hooks(self.node_id, advertised_uri(self.config))
            endpoints = self.config.clustering_etcd_endpoints.split(",")
            self._etcd = Etcd(endpoints)
            logger.info("clustering: node %s, etcd %s", self.node_id, ",".join(endpoints))
            try:
                await self._member_loop()
            finally:
                await self._follow(None)
                await self._etcd.close()
                await self._hooks.close()
        finally:
            if self.config.pidfile:
                remove_pidfile(self.config.pidfile)
            os.close(lock_fd)
        logger.info("stopped")

    # Membership: a lease in etcd, renewed by starting over when it is lost.

    async def _load_node_id(self) -> str:
        """The node's id (`load_node_id`); a first start on a full disk, which cannot write
        it yet, is held and tries again every NODE_ID_RETRY_S until there is room."""
        while True:
            try:
                return await asyncio.to_thread(load_node_id, self.config.data_dir)
            except OutOfSpace as exc:
                logger.warning(
                    "clustering: no room to write the node id (%s); trying again in %.0f s",
                    exc.strerror,
                    NODE_ID_RETRY_S,
                )
                await asyncio.sleep(NODE_ID_RETRY_S)

    async def _member_loop(self) -> None:
        while not self.stop.is_set():
            membership = await self._join()
            if membership is None:
                return
            try:
                await self._serve_member(membership)
            finally:
                with contextlib.suppress(EtcdError, OSError):
                    await asyncio.wait_for(membership.close(), RESIGN_TIMEOUT_S)
            if not self.stop.is_set():
                logger.warning("clustering: the etcd lease was lost; joining again")

    async def _join(self) -> Membership | None:
        """A started Membership with this node registered; None once `stop` is set."""
        assert self._etcd is not None
        delay = ETCD_RETRY_S_MIN
        config = self.config
        while not self.stop.is_set():
            membership = Membership(self._etcd, config.clustering_etcd_prefix, self.node_id,
                                    lease_ttl_s=config.clustering_lease_ttl_s)  # fmt: skip
            try:
                await membership.start()
                self.secret = await membership.secret()
                await membership.register(node_info(config, self.node_id))
                return membership
            except EtcdError as exc:
                logger.warning("clustering: etcd unavailable (%s); retrying", exc)
                with contextlib.suppress(EtcdError, OSError):
                    await asyncio.wait_for(membership.close(), RESIGN_TIMEOUT_S)
            await self._pause(delay)
            delay = min(delay * 2, ETCD_RETRY_S_MAX)
        return None

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), seconds)

    async def eligible(self, membership: Membership) -> bool:
        """May this node lead: no full sync unfinished, and in the ISR (or none yet)."""
        if os.path.exists(os.path.join(self.config.data_dir, SYNCING_MARKER)):
            return False
        isr = await membership.isr()
        return isr is None or self.node_id in isr

    async def _serve_member(self, membership: Membership) -> None:
        """Follow and campaign until this lease is lost or `stop`; lead when elected."""
        campaign: asyncio.Task[None] | None = None
        try:
            # A lease that lapsed once is never used again, even if a late keepalive
            # revives it: this node may have stepped down under it, and its election
            # key must expire (or be revoked) before anyone, this node too, leads again.
            while not self.stop.is_set() and _lease_held(membership):
                try:
                    if campaign is None and await self.eligible(membership):
                        campaign = asyncio.get_running_loop().create_task(membership.campaign())
                    leader = await membership.leader()
                except EtcdError as exc:
                    logger.warning("clustering: etcd unavailable (%s)", exc)
                    await self._pause(ETCD_RETRY_S_MIN)
                    continue
                await self._follow(leader if leader and leader.node_id != self.node_id else None)
                if await self._wait_for_change(membership, campaign):
                    assert campaign is not None
                    won, campaign = campaign, None
                    if won.exception() is not None:
                        logger.warning("clustering: campaign failed: %s", won.exception())
                        continue
                    await self._follow(None)
                    await self._lead(membership)
        finally:
            if campaign is not None:
                campaign.cancel()
                await asyncio.gather(campaign, return_exceptions=True)

    async def _wait_for_change(
        self, membership: Membership, campaign: asyncio.Task[None] | None
    ) -> bool:
        """Wait until the leader or ISR changes, the lease is lost, `stop`, or RECHECK_S;
        True if the campaign ended (won, or failed)."""
        others: list[asyncio.Future[Any]] = [
            asyncio.ensure_future(membership.wait_change()),
            asyncio.ensure_future(self.stop.wait()),
            asyncio.ensure_future(membership.lease_lost.wait()),
        ]
        waits: list[asyncio.Future[Any]] = [*others, *([campaign] if campaign else [])]
        try:
            await asyncio.wait(waits, timeout=RECHECK_S, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in others:
                waiting.cancel()
            await asyncio.gather(*others, return_exceptions=True)
        return campaign is not None and campaign.done()

    async def _follow(self, leader: NodeInfo | None) -> None:
        """Follow `leader` (None: nobody), unless already following it."""
        current = self.following
        if current is not None and leader is not None and current.leader == leader:
            return
        if current is not None:
            self.following = None
            await current.close()
        if leader is None:
            if not self.stop.is_set():
                notifier().status("cluster node, no leader to follow")
        else:
            link = self._link_tls
            client_tls = (lambda: link.client) if link is not None else None
            self.following = Following(self.config, self.node_id, self.secret, leader,
                                       client_tls)  # fmt: skip
            await self.following.start()
            # Ready as a follower: its client ports forward to the leader (systemd's
            # READY=1 once, the first time; STATUS= says which role, each time).
            notifier().ready(f"cluster follower, forwarding to leader {leader.node_id} "
                             f"at {leader.amqp}")  # fmt: skip

    # Leading.

    async def _lead(self, membership: Membership) -> None:
        logger.info("clustering: elected leader")
        inherited = await self._take_office(membership)
        if inherited is None:
            await self._resign(membership)
            await self._pause(ETCD_RETRY_S_MIN)  # let an eligible node win
            return
        tap = FileTap(self.config.data_dir)
        set_tap(tap)
        try:
            await self._serve_as_leader(membership, tap, inherited)
        finally:
            set_tap(None)

    async def _take_office(self, membership: Membership) -> frozenset[str] | None:
        """Writes the ISR as this node and the members of the one it was elected from
        that are still registered (kept: rule 4 of `streamq.cluster.isr`); returns those
        members, or None if this node must resign. Only the elected leader writes the
        ISR, so it cannot change between the read and the write."""
        try:
            if not await self.eligible(membership):
                logger.warning("clustering: elected but not eligible (not in sync); resigning")
                return None
            registered = {info.node_id for info in await membership.nodes()}
            inherited = ((await membership.isr() or frozenset()) & registered) - {self.node_id}
            if not await membership.set_isr(frozenset({self.node_id}) | inherited):
                logger.warning("clustering: elected but the ISR write was refused; resigning")
                return None
        except EtcdError as exc:
            logger.warning("clustering: elected but etcd failed (%s); resigning", exc)
            return None
        if inherited:
            logger.info("clustering: keeping %s in the ISR", ", ".join(sorted(inherited)))
        return frozenset(inherited)

    async def _serve_as_leader(
        self, membership: Membership, tap: FileTap, inherited: frozenset[str]
    ) -> None:
        config = self.config
        link = self._link_tls
        server_tls = (lambda: link.server) if link is not None else None
        server = ReplicationServer(tap, self.node_id, self.secret, membership,
                                   lease_valid=membership.lease_valid, tls=server_tls,
                                   inherited=inherited)  # fmt: skip
        try:
            await server.start(config.clustering_bind, config.clustering_port)
        except OSError as exc:
            logger.error("clustering: cannot listen for replication on %s:%s: %s",
                         config.clustering_bind, config.clustering_port, exc.strerror)  # fmt: skip
            await self._resign(membership)
            await self._pause(ETCD_RETRY_S_MAX)
            return
        view = LeaderView(node_info(config, self.node_id), server, membership.nodes)
        view.start()
        try:
            reason = await self._run_broker(membership, server, view)
        finally:
            await view.close()
            await server.close()
        if membership.lease_valid():
            # Shutdown, or a broker that stopped by itself: a follower takes over at once.
            await self._resign(membership)
        assert self._hooks is not None
        self._hooks.run("on_leader_lost", config.clustering_on_leader_lost)
        logger.info("clustering: lost leadership: %s", reason)
        if reason.startswith("the broker"):
            await self._pause(ETCD_RETRY_S_MAX)  # before campaigning again: others first

    async def _run_broker(
        self, membership: Membership, server: ReplicationServer, view: LeaderView
    ) -> str:
        """Serve as leader until stop, the lease lost or the broker failing; returns why
        it ended, the broker closed."""
        assert self._hooks is not None
        broker_stop = asyncio.Event()

        def attach(broker: Broker) -> None:
            broker.syncer.gate = server  # before any listener opens: every round waits
            broker.cluster = view
            server.request_round = broker.syncer.barrier

        def serving(amqp_port: int, http_port: int) -> None:
            assert self._hooks is not None
            self._hooks.run("on_leader_elected", self.config.clustering_on_leader_elected)

        role = ClusterRole(trusted_proxy=lambda ip: ip in server.follower_hosts())
        broker = asyncio.get_running_loop().create_task(
            run_broker(
                dataclasses.replace(self.config, pidfile=""),
                broker_stop,
                serving,
                attach,
                self._keep_tls,
                cluster=role,
            )
        )
        reason = await self._until_step_down(membership, broker)
        if reason != "shutdown":
            server.fence()  # first: nothing is confirmed from now on
        broker_stop.set()
        try:
            await broker
        except (ServeError, OSError) as exc:
            reason = f"the broker stopped: {exc}"
            logger.error("clustering: %s", reason)
        except Exception as exc:  # a broker that cannot open its data: another node may
            reason = f"the broker failed: {exc!r}"
            logger.exception("clustering: %s", reason)
        return reason

    async def _until_step_down(self, membership: Membership, broker: asyncio.Task[None]) -> str:
        while True:
            if broker.done():
                return "the broker stopped"
            if self.stop.is_set():
                return "shutdown"
            if not _lease_held(membership):
                return "the etcd lease expired or could not be renewed"
            pause = asyncio.ensure_future(self._pause(LEASE_CHECK_S))
            await asyncio.wait([broker, pause], return_when=asyncio.FIRST_COMPLETED)
            pause.cancel()

    def _keep_tls(self, tls: TlsContexts) -> None:
        self.tls[:] = [tls]

    def _reload_tls(self) -> None:
        """SIGHUP with clustering TLS (this handler replaces `serve`'s): reload the
        replication link's certificates, and the client listeners' when leading."""
        assert self._link_tls is not None
        self._link_tls.reload()
        if self.tls:
            self.tls[0].reload()

    async def _resign(self, membership: Membership) -> None:
        with contextlib.suppress(EtcdError, OSError, TimeoutError):
            await asyncio.wait_for(membership.resign(), RESIGN_TIMEOUT_S)


def _lease_held(membership: Membership) -> bool:
    return not membership.lease_lost.is_set() and membership.lease_valid()


def serve_clustered(config: ServeConfig) -> None:
    """Run a cluster node on uvloop until SIGTERM or SIGINT. Raises ServeError on
    start-up."""
    serve(config, lambda config, stop, tls: Node(config, stop, tls).run())
