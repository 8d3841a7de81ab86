"""Membership against a real etcd: the node id, the lease and its loss, registration,
the election, the fenced ISR and change notification. Leases are 3 s to stay fast
(valid for 2 s after each keepalive, sent every second)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from streamq.cluster.etcd import Etcd
from streamq.cluster.membership import (
    LeaseLost,
    Membership,
    NodeInfo,
    load_node_id,
)
from tests.cluster.etcd_server import EtcdServer

pytestmark = pytest.mark.timeout(60)
TTL_S = 3


def info(node_id: str, port: int) -> NodeInfo:
    return NodeInfo(node_id, f"tcp://127.0.0.1:{port}", f"127.0.0.1:{port + 1}", "127.0.0.1:1")


Factory = Callable[[str], Membership]


@pytest.fixture
async def member(etcd: EtcdServer) -> AsyncIterator[Factory]:
    """Makes started-later Memberships on one etcd (each with its own client), and closes
    them all at the end."""
    made: list[Membership] = []

    def make(node_id: str) -> Membership:
        membership = Membership(
            Etcd([etcd.endpoint], timeout_s=1.0), "test", node_id, lease_ttl_s=TTL_S
        )
        made.append(membership)
        return membership

    yield make
    for membership in made:
        if etcd.process.poll() is None:
            etcd.resume()
        await membership.close()
        await membership.etcd.close()


async def joined(make: Factory, node_id: str, port: int) -> Membership:
    membership = make(node_id)
    await membership.start()
    await membership.register(info(node_id, port))
    return membership


def test_the_node_id_is_created_once(tmp_path: Path) -> None:
    node_id = load_node_id(str(tmp_path / "data"))
    assert 0 < int(node_id, 36) < 2**31
    assert load_node_id(str(tmp_path / "data")) == node_id
    assert (tmp_path / "data" / ".clustering_id").read_text().strip() == node_id
    assert load_node_id(str(tmp_path / "other")) != node_id  # 1 in 2**31 to fail


def test_a_bad_node_id_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / ".clustering_id").write_text("not/an id")
    with pytest.raises(ValueError, match="not a base36 node id"):
        load_node_id(str(tmp_path))


def test_node_info_round_trips_through_json() -> None:
    node = NodeInfo("abc", "tcp://h:5679", "h:5672", "h:15672", amqps="h:5671")
    assert NodeInfo.from_json(node.to_json()) == node
    with pytest.raises(ValueError, match="not a node's info"):
        NodeInfo.from_json(b'{"node_id": "x"}')
    with pytest.raises(ValueError):
        NodeInfo.from_json(b"[1, 2]")


async def test_registered_nodes_and_one_secret(member: Factory) -> None:
    a, b = await joined(member, "a", 1000), await joined(member, "b", 2000)
    assert sorted(await a.nodes(), key=lambda node: node.node_id) == [
        info("a", 1000),
        info("b", 2000),
    ]
    secret = await a.secret()
    assert len(secret) >= 32
    assert await b.secret() == secret
    await b.close()
    assert await a.nodes() == [info("a", 1000)]  # b's entry went with its lease


async def test_one_wins_the_election_and_the_other_waits(member: Factory) -> None:
    a, b = await joined(member, "a", 1000), await joined(member, "b", 2000)
    assert await a.leader() is None
    await a.campaign()
    assert await b.leader() == info("a", 1000)
    waiting = asyncio.create_task(b.campaign())
    await asyncio.sleep(0.5)
    assert not waiting.done()
    await a.resign()
    await asyncio.wait_for(waiting, 5)
    assert await a.leader() == info("b", 2000)


async def test_the_next_candidate_wins_when_the_leader_lease_expires(
    member: Factory, etcd: EtcdServer
) -> None:
    """The leader's keepalives stop (its task is cancelled, as in a hung process): after
    its TTL etcd drops its key and the waiting candidate is elected."""
    a, b = await joined(member, "a", 1000), await joined(member, "b", 2000)
    await a.campaign()
    waiting = asyncio.create_task(b.campaign())
    assert a._keepalive is not None
    a._keepalive.cancel()
    started = time.monotonic()
    await asyncio.wait_for(waiting, TTL_S + 5)
    assert time.monotonic() - started >= TTL_S - 1.5
    assert await b.leader() == info("b", 2000)
    assert a.lease_lost.is_set() and not a.lease_valid()
    assert not await a.set_isr(frozenset({"a"}))


async def test_only_the_leader_sets_the_isr(member: Factory) -> None:
    a, b = await joined(member, "a", 1000), await joined(member, "b", 2000)
    assert await a.isr() is None
    assert not await a.set_isr(frozenset({"a"}))  # not elected yet
    await a.campaign()
    waiting = asyncio.create_task(b.campaign())
    await asyncio.sleep(0.3)
    assert not await b.set_isr(frozenset({"b"}))  # a candidate, not the leader
    assert await a.set_isr(frozenset({"a", "b"}))
    assert await b.isr() == frozenset({"a", "b"})
    assert await a.set_isr(frozenset())
    assert await b.isr() == frozenset()
    await a.resign()
    assert not await a.set_isr(frozenset({"a"}))
    await asyncio.wait_for(waiting, 5)
    assert await b.set_isr(frozenset({"b"}))
    assert await a.isr() == frozenset({"b"})


async def test_a_guard_key_gone_fences_the_isr(member: Factory) -> None:
    """Even with a lease that looks valid locally, the transaction is what fences: with
    the election key gone (as etcd deletes it when the lease expires), set_isr fails."""
    a = await joined(member, "a", 1000)
    await a.campaign()
    assert await a.set_isr(frozenset({"a"}))
    assert a._leader_key is not None
    await a.etcd.delete(a._leader_key)
    assert a.lease_valid()
    assert not await a.set_isr(frozenset({"a", "x"}))
    assert await a.isr() == frozenset({"a"})


async def test_a_paused_etcd_loses_the_lease_within_the_ttl(
    member: Factory, etcd: EtcdServer
) -> None:
    a = await joined(member, "a", 1000)
    await a.campaign()
    etcd.pause()
    paused = time.monotonic()
    await asyncio.wait_for(a.lease_lost.wait(), TTL_S + 1)
    assert time.monotonic() - paused <= TTL_S
    assert not a.lease_valid()
    assert not await a.set_isr(frozenset({"a"}))
    with pytest.raises(LeaseLost):
        await a.campaign()
    etcd.resume()
    # A new lease, registered again, once etcd answers.
    await a.start()
    assert a.lease_valid() and not a.lease_lost.is_set()
    assert await a.nodes() == [info("a", 1000)]


async def test_a_paused_process_sees_its_lease_invalid_on_resume(member: Factory) -> None:
    """The event loop is blocked past the lease (as SIGSTOP would): lease_valid() is False
    at once on resume, before any keepalive or timer could run."""
    a = await joined(member, "a", 1000)
    assert a.lease_valid()
    time.sleep(TTL_S - 0.9)  # blocking the loop is the point
    assert not a.lease_valid()
    await asyncio.wait_for(a.lease_lost.wait(), 1)


async def test_the_lease_stays_valid_while_kept_alive(member: Factory) -> None:
    a = await joined(member, "a", 1000)
    await asyncio.sleep(TTL_S * 2)
    assert a.lease_valid() and not a.lease_lost.is_set()


async def test_wait_change_wakes_on_an_isr_change(member: Factory) -> None:
    a, b = await joined(member, "a", 1000), await joined(member, "b", 2000)
    await a.campaign()
    assert await b.isr() is None
    waiting = asyncio.create_task(b.wait_change())
    await asyncio.sleep(0.3)
    assert not waiting.done()
    assert await a.set_isr(frozenset({"a"}))
    await asyncio.wait_for(waiting, 5)


async def test_wait_change_wakes_on_a_leader_change(member: Factory) -> None:
    a, b = await joined(member, "a", 1000), await joined(member, "b", 2000)
    await a.campaign()
    assert await b.leader() == info("a", 1000)
    waiting = asyncio.create_task(b.wait_change())
    await asyncio.sleep(0.3)
    assert not waiting.done()
    await a.close()  # revokes the lease: the leader key goes
    await asyncio.wait_for(waiting, 5)
    assert await b.leader() is None


async def test_wait_change_misses_no_change_made_after_the_read(member: Factory) -> None:
    a, b = await joined(member, "a", 1000), await joined(member, "b", 2000)
    assert await b.isr() is None
    assert await b.leader() is None
    await a.campaign()  # after b's reads, before b waits
    await asyncio.wait_for(b.wait_change(), 5)


async def test_etcd_down_makes_wait_change_fail(member: Factory, etcd: EtcdServer) -> None:
    b = await joined(member, "b", 2000)
    etcd.stop()
    with pytest.raises(Exception, match="no etcd endpoint answered"):
        await asyncio.wait_for(b.wait_change(), 10)
