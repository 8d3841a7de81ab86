"""Replication between an in-process leader and followers over real loopback sockets: full
sync, the live stream, the gate that holds rounds for the in-sync replicas, and the ISR
rules (drop a late follower in the store before releasing; a failing store keeps rounds
held; fence fails them)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from streamq.cluster.replication import ReplicationError
from streamq.cluster.sync import SYNCING_MARKER
from streamq.log.errors import ReplicationFenced
from tests.cluster.replication_helpers import (
    Follower,
    Leader,
    MemoryIsrStore,
    Relay,
    eventually,
    tree,
)

pytestmark = pytest.mark.timeout(120)


async def caught_up(leader: Leader, *followers: Follower) -> None:
    position = leader.tap.position
    await eventually(lambda: all(f.client.acked >= position for f in followers))


async def test_follower_mirrors_leader_through_sync_and_stream(tmp_path: Path) -> None:
    store = MemoryIsrStore()
    leader = Leader(tmp_path / "leader", store)
    (tmp_path / "leader" / "definitions.json").write_bytes(b"{}")  # before the tap: synced
    leader.workload.mixed(40)
    await leader.start()
    follower = Follower(tmp_path / "f1", "f1", leader.uri)
    try:
        leader.workload.mixed(40, seed=40)  # while it syncs
        await eventually(lambda: follower.client.synced)
        leader.workload.mixed(40, seed=80)  # live
        await caught_up(leader, follower)
        assert tree(follower.root) == tree(leader.root)
        assert not (follower.root / SYNCING_MARKER).exists()
        await eventually(lambda: "f1" in store.isr if store.isr else False)
        assert leader.server.isr == {"leader", "f1"}
        [status] = leader.server.followers()
        assert (status.node_id, status.state, status.in_isr) == ("f1", "streaming", True)
        assert leader.server.follower_hosts() == {"127.0.0.1"}
    finally:
        await follower.stop()
        await leader.server.close()


async def test_rounds_wait_for_every_in_sync_follower(tmp_path: Path) -> None:
    store = MemoryIsrStore()
    leader = await Leader(tmp_path / "leader", store).start()
    assert await asyncio.wait_for(leader.round(), 5) is None  # ISR = the leader alone
    relays = [await Relay(leader.port).start() for _ in range(2)]
    followers = [Follower(tmp_path / f"f{i}", f"f{i}", r.uri) for i, r in enumerate(relays)]
    try:
        leader.workload.mixed(10)
        await eventually(lambda: leader.server.isr == {"leader", "f0", "f1"})
        await eventually(lambda: store.isr == {"leader", "f0", "f1"})
        relays[1].flowing.clear()  # f1 stops receiving and acking
        leader.workload.mixed(5, seed=10)
        held = leader.round()
        await caught_up(leader, followers[0])
        await asyncio.sleep(0.3)
        assert not held.done(), "released before f1 acked"
        relays[1].flowing.set()
        assert await asyncio.wait_for(held, 5) is None
        assert followers[1].client.acked >= leader.tap.position - 0
        for follower in followers:
            assert tree(follower.root) == tree(leader.root)
    finally:
        for follower in followers:
            await follower.stop()
        await leader.server.close()
        for relay in relays:
            await relay.close()


async def test_wrong_secret_is_refused(tmp_path: Path) -> None:
    leader = await Leader(tmp_path / "leader", MemoryIsrStore()).start()
    follower = Follower(tmp_path / "f1", "f1", leader.uri, secret="wrong")
    try:
        with pytest.raises(ReplicationError, match="refused"):
            await asyncio.wait_for(follower.task, 10)
        assert leader.server.followers() == []
        assert not (follower.root / SYNCING_MARKER).exists()
    finally:
        await leader.server.close()


async def test_follower_cut_mid_sync_converges_on_reconnect(tmp_path: Path) -> None:
    """A sync of large files is cut while a file is half copied (the relay pauses the
    transfer, then the follower stops); a new connection finishes it from what it has."""
    store = MemoryIsrStore()
    leader = Leader(tmp_path / "leader", store)
    for i in range(3):
        leader.workload.write(f"log/big{i}.seg", 0, os.urandom(8 << 20))
    await leader.start()
    relay = await Relay(leader.port).start()
    first = Follower(tmp_path / "f1", "f1", relay.uri)
    big0 = tmp_path / "f1" / "log" / "big0.seg"
    await eventually(lambda: big0.exists() and big0.stat().st_size > 0)
    relay.flowing.clear()
    await first.stop()
    assert (tmp_path / "f1" / SYNCING_MARKER).exists()
    assert tree(tmp_path / "f1") != tree(leader.root)
    await relay.close()
    second = Follower(tmp_path / "f1", "f1", leader.uri)
    try:
        leader.workload.mixed(10)
        await eventually(lambda: second.client.synced)
        await caught_up(leader, second)
        assert tree(second.root) == tree(leader.root)
        assert not (second.root / SYNCING_MARKER).exists()
    finally:
        await second.stop()
        await leader.server.close()


async def test_unconfirmed_tail_and_strays_are_cut_to_the_leaders_content(
    tmp_path: Path,
) -> None:
    """A former leader's copy: a segment with a tail the cluster never had, a journal that
    differs, a queue directory the leader deleted. After sync it equals the leader's."""
    leader = Leader(tmp_path / "leader", MemoryIsrStore())
    segment = os.urandom(300_000)
    leader.workload.write("log/00000000.seg", 0, segment)
    leader.workload.write("queues/q/journal", 0, b"leader's journal")
    await leader.start()
    old = tmp_path / "old"
    (old / "log").mkdir(parents=True)
    (old / "log" / "00000000.seg").write_bytes(segment + b"unconfirmed tail" * 100)
    (old / "queues" / "q").mkdir(parents=True)
    (old / "queues" / "q" / "journal").write_bytes(b"former leader's journal, longer")
    (old / "queues" / "gone").mkdir()
    (old / "queues" / "gone" / "journal").write_bytes(b"deleted on the leader")
    (old / ".clustering_id").write_bytes(b"old")  # node-local: kept
    follower = Follower(old, "old", leader.uri)
    try:
        await eventually(lambda: follower.client.synced)
        assert tree(old) == tree(leader.root)
        assert (old / ".clustering_id").read_bytes() == b"old"
    finally:
        await follower.stop()
        await leader.server.close()


async def test_late_follower_is_dropped_in_the_store_before_the_round_releases(
    tmp_path: Path,
) -> None:
    store = MemoryIsrStore()
    leader = await Leader(tmp_path / "leader", store, ack_timeout_s=0.5).start()
    relay = await Relay(leader.port).start()
    follower = Follower(tmp_path / "f1", "f1", relay.uri)
    try:
        leader.workload.mixed(5)
        await eventually(lambda: store.isr == {"leader", "f1"})
        relay.flowing.clear()
        store.gate.clear()  # the store takes the drop only when the test says so
        leader.workload.mixed(2, seed=5)
        held = leader.round()
        await asyncio.sleep(1.5)  # well past ack_timeout_s
        assert not held.done(), "released before the store accepted the new ISR"
        assert leader.server.isr == {"leader", "f1"}
        store.gate.set()
        assert await asyncio.wait_for(held, 5) is None
        assert store.isr == {"leader"}
        assert leader.server.isr == {"leader"}
        relay.flowing.set()
        # It catches up and joins again.
        await eventually(lambda: store.isr == {"leader", "f1"})
    finally:
        await follower.stop()
        await leader.server.close()
        await relay.close()


@pytest.mark.parametrize("failure", ["raises", "refuses"])
async def test_failing_store_keeps_rounds_held(tmp_path: Path, failure: str) -> None:
    store = MemoryIsrStore()
    leader = await Leader(tmp_path / "leader", store, ack_timeout_s=0.3).start()
    follower = Follower(tmp_path / "f1", "f1", leader.uri)
    try:
        leader.workload.mixed(3)
        await eventually(lambda: store.isr == {"leader", "f1"})
        if failure == "raises":
            store.fail = True
        else:
            store.refuse = True
        await follower.stop()  # gone: it must leave the ISR before any round releases
        leader.workload.mixed(1, seed=3)
        held = leader.round()
        await asyncio.sleep(1.5)
        assert not held.done()
        assert store.isr == {"leader", "f1"}
        store.fail = store.refuse = False
        assert await asyncio.wait_for(held, 5) is None
        assert store.isr == {"leader"}
    finally:
        await leader.server.close()


async def test_fence_fails_held_and_later_rounds(tmp_path: Path) -> None:
    store = MemoryIsrStore()
    leader = await Leader(tmp_path / "leader", store).start()
    relay = await Relay(leader.port).start()
    follower = Follower(tmp_path / "f1", "f1", relay.uri)
    try:
        await eventually(lambda: store.isr == {"leader", "f1"})
        relay.flowing.clear()
        leader.workload.mixed(1)
        held = leader.round()
        await asyncio.sleep(0.1)
        leader.server.fence()
        assert isinstance(await asyncio.wait_for(held, 5), ReplicationFenced)
        assert isinstance(await asyncio.wait_for(leader.round(), 5), ReplicationFenced)
        await eventually(lambda: leader.server.followers() == [])
    finally:
        await follower.stop()
        await leader.server.close()
        await relay.close()


async def test_lost_lease_releases_nothing(tmp_path: Path) -> None:
    leader = await Leader(tmp_path / "leader", MemoryIsrStore()).start()
    try:
        leader.lease_ok = False
        leader.workload.mixed(1)
        held = leader.round()
        await asyncio.sleep(0.5)
        assert not held.done()
        leader.lease_ok = True
        assert await asyncio.wait_for(held, 5) is None
    finally:
        await leader.server.close()


async def test_second_connection_of_a_node_replaces_the_first(tmp_path: Path) -> None:
    store = MemoryIsrStore()
    leader = await Leader(tmp_path / "leader", store).start()
    first = Follower(tmp_path / "a", "f1", leader.uri)
    try:
        await eventually(lambda: first.client.synced)
        second = Follower(tmp_path / "b", "f1", leader.uri)
        with pytest.raises(ReplicationError):
            await asyncio.wait_for(first.task, 10)
        leader.workload.mixed(5)
        await caught_up(leader, second)
        assert tree(second.root) == tree(leader.root)
        assert [s.node_id for s in leader.server.followers()] == ["f1"]
        await second.stop()
    finally:
        await leader.server.close()


async def test_follower_needing_trimmed_bytes_resyncs(tmp_path: Path) -> None:
    """The tap keeps at most retain_bytes_max: a stalled follower whose next bytes were
    trimmed is disconnected; it connects again, syncs, and converges."""
    store = MemoryIsrStore()
    leader = await Leader(tmp_path / "leader", store, retain_bytes_max=1 << 20).start()
    relay = await Relay(leader.port).start()
    follower = Follower(tmp_path / "f1", "f1", relay.uri)
    try:
        await eventually(lambda: follower.client.synced)
        relay.flowing.clear()
        for i in range(40):
            leader.workload.append("log/00000000.seg", bytes([i]) * 200_000)
        relay.flowing.set()
        with pytest.raises(ReplicationError):
            await asyncio.wait_for(follower.task, 20)
        again = Follower(tmp_path / "f1", "f1", leader.uri)
        await eventually(lambda: again.client.synced)
        await caught_up(leader, again)
        assert tree(again.root) == tree(leader.root)
        await again.stop()
    finally:
        await follower.stop()
        await leader.server.close()
        await relay.close()
