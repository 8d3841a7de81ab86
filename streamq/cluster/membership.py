"""A node's membership of the cluster, held in etcd under one prefix (LavinMQ's layout):

    <prefix>/nodes/<id>          this node's NodeInfo (JSON), bound to its lease
    <prefix>/leader/<lease hex>  election candidates (etcd's election service); the oldest
                                 one is the leader, its value the leader's advertised URI
    <prefix>/isr                 the in-sync replicas, comma-separated node ids
    <prefix>/clustering_secret   the shared secret followers authenticate with

Rules:
1. One lease per Membership, kept alive every ttl/3 by a task. `lease_valid()` counts from
   the *send* time of the last keepalive that succeeded, less a margin: etcd renewed the
   lease no earlier than that, so while it is True no other node can hold the election key.
   A process paused past its lease sees False on resume, before any answer from etcd.
2. `lease_lost` is set, once per lease, when etcd says the lease is gone or when
   `lease_valid()` turns False (a timer watches the deadline, so failing keepalives and a
   silent etcd both end there). A lost lease never comes back: `start()` again grants a
   new one (and re-registers).
3. The ISR changes only in a transaction guarded by our election key (fencing): a node that
   is not the elected leader, or whose lease expired, can never change it.

This module owns no replication and no broker: it says who leads and who is in sync.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import string
import time
from dataclasses import asdict, dataclass
from typing import Final

from streamq.cluster.etcd import Etcd, EtcdError, KeyValue
from streamq.log.files import write_file_atomic

logger = logging.getLogger(__name__)

NODE_ID_FILE: Final = ".clustering_id"
# lease_valid() ends this long before etcd could expire the lease: clock rates differ and
# the other node's campaign needs a moment to be granted.
LEASE_MARGIN_S: Final = 1.0
# After a failed keepalive, retry this often until the lease is renewed or invalid.
KEEPALIVE_RETRY_S: Final = 0.25
_BASE36: Final = string.digits + string.ascii_lowercase


class LeaseLost(EtcdError):
    """This node's lease is gone (or may be): it can hold no election key."""


def base36(number: int) -> str:
    assert number > 0, number
    digits = ""
    while number:
        number, digit = divmod(number, 36)
        digits = _BASE36[digit] + digits
    return digits


def load_node_id(data_dir: str) -> str:
    """This node's id: `.clustering_id` in the data dir, created once as base36 of a random
    positive i32 (LavinMQ's). Fsyncs the file and the directory before returning a new id.
    Raises ValueError if the file holds something else."""
    path = os.path.join(data_dir, NODE_ID_FILE)
    try:
        with open(path, encoding="ascii", errors="replace") as file:
            node_id = file.read().strip()
    except FileNotFoundError:
        node_id = base36(secrets.randbelow(2**31 - 1) + 1)
        os.makedirs(data_dir, exist_ok=True)
        write_file_atomic(path, node_id.encode() + b"\n", fsync_dir=True)
        return node_id
    if not node_id or len(node_id) > 7 or any(c not in _BASE36 for c in node_id):
        raise ValueError(f"{path} holds {node_id[:40]!r}, not a base36 node id")
    return node_id


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """What a node tells the others (JSON in etcd): its replication URI and listeners."""

    node_id: str
    advertised_uri: str  # "tcp://host:port": the replication (clustering) port
    amqp: str  # "host:port"
    http: str
    amqps: str = ""
    https: str = ""
    # The stream protocol's listener ("host:port", followers pipe to the leader's) and
    # the address clients are told in Metadata ("" without a stream port, or from a
    # node of before follower reads).
    stream: str = ""
    stream_advertised: str = ""
    mqtt: str = ""  # "": no MQTT listener (or a node from before MQTT was forwarded)
    mqtts: str = ""

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> NodeInfo:
        """Raises ValueError on anything but a NodeInfo's JSON."""
        try:
            fields = json.loads(data)
            return cls(**{name: str(fields[name]) for name in _FIELDS if name in fields})
        except (TypeError, KeyError, AttributeError) as exc:
            raise ValueError(f"not a node's info: {data[:200]!r}") from exc


_FIELDS: Final = tuple(NodeInfo.__dataclass_fields__)


def parse_isr(value: bytes) -> frozenset[str]:
    return frozenset(node for node in value.decode(errors="replace").split(",") if node)


class Membership:
    """This node's lease, registration, election and ISR in etcd (the module docstring has
    the layout and rules). Methods raise EtcdUnavailable when etcd does not answer in time."""

    def __init__(self, etcd: Etcd, prefix: str, node_id: str, *, lease_ttl_s: int = 10) -> None:
        if lease_ttl_s < 2:
            raise ValueError(f"lease_ttl_s must be at least 2, not {lease_ttl_s}")
        assert node_id and "," not in node_id, node_id
        self.etcd = etcd
        self.prefix = prefix.rstrip("/")
        self.node_id = node_id
        self.lease_ttl_s = lease_ttl_s
        self.lease = 0
        self.lease_lost = asyncio.Event()
        self.lost_reason = ""
        self._valid_until = 0.0  # time.monotonic()
        self._keepalive: asyncio.Task[None] | None = None
        self._watchdog: asyncio.TimerHandle | None = None
        self._info: NodeInfo | None = None
        self._leader_key: str | None = None
        # Revisions of the last ISR and leader reads: wait_change() watches from there.
        self._observed: dict[str, int] = {}

    @property
    def election(self) -> str:
        return f"{self.prefix}/leader"

    @property
    def isr_key(self) -> str:
        return f"{self.prefix}/isr"

    def node_key(self, node_id: str) -> str:
        return f"{self.prefix}/nodes/{node_id}"

    # The lease.

    async def start(self) -> None:
        """Grants a lease and keeps it alive in a task. Called again after `lease_lost`, it
        revokes the old lease (best effort), grants a new one and re-registers."""
        if self.lease and not self.lease_lost.is_set():
            return
        await self._stop_keepalive(revoke=True)
        sent = time.monotonic()
        self.lease = await self.etcd.lease_grant(self.lease_ttl_s)
        self.lease_lost.clear()
        self.lost_reason = ""
        self._leader_key = None
        self._renewed(sent, self.lease_ttl_s)
        self._keepalive = asyncio.create_task(self._keep_alive(self.lease))
        if self._info is not None:
            await self.register(self._info)

    def lease_valid(self) -> bool:
        """While True, etcd still holds our lease (rule 1)."""
        return (
            self.lease != 0
            and not self.lease_lost.is_set()
            and time.monotonic() < self._valid_until
        )

    def _renewed(self, sent: float, ttl_s: int) -> None:
        self._valid_until = sent + min(ttl_s, self.lease_ttl_s) - LEASE_MARGIN_S
        if self._watchdog is not None:
            self._watchdog.cancel()
        delay = max(0.0, self._valid_until - time.monotonic())
        self._watchdog = asyncio.get_running_loop().call_later(delay, self._check_deadline)

    def _check_deadline(self) -> None:
        self._watchdog = None
        if not self.lease_valid():
            self._lose(f"no keepalive succeeded within {self.lease_ttl_s - LEASE_MARGIN_S} s")

    def _lose(self, reason: str) -> None:
        if self.lease_lost.is_set():
            return
        logger.warning("clustering: lease %x lost: %s", self.lease, reason)
        self.lost_reason = reason
        self.lease_lost.set()
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self._keepalive is not None and self._keepalive is not asyncio.current_task():
            self._keepalive.cancel()

    async def _keep_alive(self, lease: int) -> None:
        """Renews `lease` every ttl/3 (sooner after a failure) until it is lost."""
        interval = self.lease_ttl_s / 3
        while not self.lease_lost.is_set():
            await asyncio.sleep(interval)
            sent = time.monotonic()
            try:
                ttl_s = await self.etcd.lease_keepalive(lease)
            except EtcdError as exc:
                logger.warning("clustering: lease keepalive failed: %s", exc)
                interval = KEEPALIVE_RETRY_S
                continue  # the watchdog ends the lease at its deadline
            if ttl_s <= 0:
                self._lose("etcd says the lease is gone")
                return
            if self.lease_lost.is_set():
                return  # the deadline passed while this keepalive was on its way
            self._renewed(sent, ttl_s)
            interval = self.lease_ttl_s / 3

    async def _stop_keepalive(self, *, revoke: bool) -> None:
        if self._keepalive is not None:
            self._keepalive.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keepalive
            self._keepalive = None
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        lease, self.lease = self.lease, 0
        if revoke and lease:
            try:
                await self.etcd.lease_revoke(lease)
            except EtcdError as exc:
                logger.warning("clustering: could not revoke lease %x: %s", lease, exc)

    async def close(self) -> None:
        """Stops the keepalive and revokes the lease: our node key and any election key go
        at once. The Etcd client stays open (its owner closes it)."""
        self._leader_key = None
        await self._stop_keepalive(revoke=True)
        self.lease_lost.set()

    # Nodes and the secret.

    async def register(self, info: NodeInfo) -> None:
        """Puts our NodeInfo at <prefix>/nodes/<id>, bound to the lease (it goes with it)."""
        assert info.node_id == self.node_id, (info.node_id, self.node_id)
        assert self.lease, "start() first"
        self._info = info
        await self.etcd.put(self.node_key(self.node_id), info.to_json(), lease=self.lease)

    async def nodes(self) -> list[NodeInfo]:
        """Every registered node (a malformed entry is logged and left out)."""
        kvs, _ = await self.etcd.range(self.node_key(""), prefix=True)
        return [info for kv in kvs if (info := _node_info(kv)) is not None]

    async def secret(self) -> str:
        """The cluster's shared secret: created by the first node that asks."""
        created = secrets.token_urlsafe(32).encode()
        stored = await self.etcd.put_if_absent(f"{self.prefix}/clustering_secret", created)
        return stored.decode(errors="replace")

    # The ISR.

    async def isr(self) -> frozenset[str] | None:
        """The in-sync replicas; None if never set (a fresh cluster)."""
        kvs, revision = await self.etcd.range(self.isr_key)
        self._observed["isr"] = revision
        return parse_isr(kvs[0].value) if kvs else None

    async def set_isr(self, ids: frozenset[str]) -> bool:
        """Writes the ISR only while we hold the election key (rule 3); False if not."""
        assert all(node and "," not in node for node in ids), ids
        if self._leader_key is None or not self.lease_valid():
            return False
        value = ",".join(sorted(ids)).encode()
        return await self.etcd.put_if_exists(self._leader_key, self.isr_key, value)

    # The election.

    async def campaign(self) -> None:
        """Blocks until elected leader (value: our advertised URI, bound to our lease).
        Raises LeaseLost if the lease is lost first (or turns out gone on winning)."""
        assert self._info is not None, "register() first"
        if not self.lease_valid():
            raise LeaseLost(f"no valid lease to campaign with: {self.lost_reason}")
        campaign = asyncio.ensure_future(
            self.etcd.campaign(self.election, self._info.advertised_uri.encode(), self.lease)
        )
        lost = asyncio.ensure_future(self.lease_lost.wait())
        try:
            await asyncio.wait((campaign, lost), return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
            if not campaign.done():
                campaign.cancel()  # etcd withdraws our candidate key
                await asyncio.gather(campaign, return_exceptions=True)
        if campaign.cancelled():
            raise LeaseLost(f"lease lost while campaigning: {self.lost_reason}")
        key = campaign.result()
        # etcd's campaign returns once older candidates are gone, even if our own key
        # went with an expired lease meanwhile: check that we still hold it.
        if not self.lease_valid() or await self.etcd.get(key) is None:
            raise LeaseLost(f"lease lost while campaigning: {self.lost_reason or 'key gone'}")
        self._leader_key = key
        logger.info("clustering: %s holds the election key %s", self.node_id, key)

    async def resign(self) -> None:
        """Gives up leadership (deletes our election key); nothing if we do not hold it."""
        key, self._leader_key = self._leader_key, None
        if key is not None:
            await self.etcd.resign(self.election, key)

    async def leader(self) -> NodeInfo | None:
        """The elected node's NodeInfo (its nodes/ entry: the one on the leader key's lease,
        else the one with the elected advertised URI); None if there is no leader."""
        kv, revision = await self.etcd.leader_kv(self.election)
        self._observed["leader"] = revision
        if kv is None:
            return None
        entries, _ = await self.etcd.range(self.node_key(""), prefix=True)
        same_lease = [entry for entry in entries if entry.lease == kv.lease]
        uri = kv.value.decode(errors="replace")
        for entry in same_lease + entries:
            info = _node_info(entry)
            if info is not None and info.advertised_uri == uri:
                return info
        return None

    async def wait_change(self) -> None:
        """Returns when the leader key or the ISR changes after what isr() and leader() last
        read (or after now, if neither did since the last wait_change)."""
        start = min(self._observed.values()) + 1 if self._observed else 0
        self._observed.clear()
        watches = [
            asyncio.ensure_future(_first_change(self.etcd, key, prefix, start))
            for key, prefix in ((self.isr_key, False), (self.election + "/", True))
        ]
        try:
            done, _ = await asyncio.wait(watches, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for watch in watches:
                watch.cancel()
            await asyncio.gather(*watches, return_exceptions=True)
        for watch in done:
            watch.result()  # raises EtcdUnavailable if a watch could not be made


async def _first_change(etcd: Etcd, key: str, prefix: bool, start_revision: int) -> None:
    changes = etcd.watch(key, prefix=prefix, start_revision=start_revision)
    try:
        await anext(changes)
    finally:
        await changes.aclose()


def _node_info(kv: KeyValue) -> NodeInfo | None:
    try:
        return NodeInfo.from_json(kv.value)
    except ValueError as exc:
        logger.warning("clustering: ignoring %s: %s", kv.key, exc)
        return None
