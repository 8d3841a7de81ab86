"""The etcd client against a real etcd (Debian's etcd-server, started per test on free
loopback ports): keys, transactions, leases, elections, watches and endpoint failover."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator

import pytest

from streamq.cluster.etcd import Etcd, EtcdError, EtcdUnavailable, prefix_range_end
from tests.cluster.etcd_server import EtcdServer
from tests.differential.peers import free_port

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def client(etcd: EtcdServer) -> AsyncIterator[Etcd]:
    client = Etcd([etcd.endpoint], timeout_s=3.0)
    yield client
    await client.close()


def test_prefix_range_end() -> None:
    assert prefix_range_end("a/") == b"a0"
    assert prefix_range_end("a\xff") == "a\xff".encode()[:-1] + b"\xc0"
    assert prefix_range_end("") == b"\0"


async def test_put_get_delete_and_prefix(client: Etcd) -> None:
    assert await client.get("q/a") is None
    await client.put("q/a", b"1")
    await client.put("q/b", b"\x00\xff binary")
    await client.put("qx", b"outside the prefix")
    assert await client.get("q/a") == b"1"
    assert await client.get_prefix("q/") == {"q/a": b"1", "q/b": b"\x00\xff binary"}
    await client.delete("q/a")
    assert await client.get("q/a") is None
    kvs, revision = await client.range("q/", prefix=True)
    assert [kv.key for kv in kvs] == ["q/b"]
    assert revision >= kvs[0].mod_revision > 0


async def test_put_if_absent_keeps_the_first_value(client: Etcd) -> None:
    assert await client.put_if_absent("secret", b"first") == b"first"
    assert await client.put_if_absent("secret", b"second") == b"first"
    assert await client.get("secret") == b"first"


async def test_put_if_exists_is_fenced_by_the_guard(client: Etcd) -> None:
    assert not await client.put_if_exists("guard", "isr", b"a")
    assert await client.get("isr") is None
    await client.put("guard", b"")
    assert await client.put_if_exists("guard", "isr", b"a,b")
    assert await client.get("isr") == b"a,b"
    await client.delete("guard")
    assert not await client.put_if_exists("guard", "isr", b"c")
    assert await client.get("isr") == b"a,b"


async def test_lease_expiry_removes_its_keys(client: Etcd) -> None:
    lease = await client.lease_grant(2)
    await client.put("bound", b"x", lease=lease)
    assert await client.lease_keepalive(lease) == 2
    deadline = time.monotonic() + 10
    while await client.get("bound") is not None:
        assert time.monotonic() < deadline, "the lease never expired"
        await asyncio.sleep(0.2)
    assert await client.lease_keepalive(lease) == 0
    await client.lease_revoke(lease)  # already gone: fine


async def test_lease_revoke_removes_its_keys_at_once(client: Etcd) -> None:
    lease = await client.lease_grant(30)
    await client.put("bound", b"x", lease=lease)
    await client.lease_revoke(lease)
    assert await client.get("bound") is None
    with pytest.raises(EtcdError, match="lease not found"):
        await client.put("again", b"x", lease=lease)


async def test_campaign_waits_for_the_leader_to_resign(client: Etcd) -> None:
    first, second = await client.lease_grant(30), await client.lease_grant(30)
    assert await client.leader("election") is None
    key = await client.campaign("election", b"first", first)
    assert key.startswith("election/")
    assert await client.leader("election") == b"first"
    waiting = asyncio.create_task(client.campaign("election", b"second", second))
    await asyncio.sleep(0.5)
    assert not waiting.done()
    await client.resign("election", key)
    second_key = await asyncio.wait_for(waiting, 5)
    assert await client.leader("election") == b"second"
    assert second_key != key


async def test_a_cancelled_campaign_withdraws_its_candidate(client: Etcd) -> None:
    first, second, third = [await client.lease_grant(30) for _ in range(3)]
    key = await client.campaign("election", b"first", first)
    waiting = asyncio.create_task(client.campaign("election", b"second", second))
    await asyncio.sleep(0.3)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    # etcd deletes the withdrawn candidate's key: the third candidate is next in line.
    deadline = time.monotonic() + 5
    while len(await client.get_prefix("election/")) != 1:
        assert time.monotonic() < deadline, "the cancelled candidate's key stayed"
        await asyncio.sleep(0.1)
    third_waiting = asyncio.create_task(client.campaign("election", b"third", third))
    await client.resign("election", key)
    await asyncio.wait_for(third_waiting, 5)
    assert await client.leader("election") == b"third"


async def next_change(changes: AsyncGenerator[None]) -> None:
    await asyncio.wait_for(anext(changes), 5)


async def test_watch_yields_once_per_change(client: Etcd) -> None:
    changes = client.watch("w/", prefix=True)
    first = asyncio.ensure_future(next_change(changes))
    await asyncio.sleep(0.3)  # the watch is created before the change
    assert not first.done()
    await client.put("w/a", b"1")
    await first
    await client.delete("w/a")
    await next_change(changes)
    await client.put("other", b"1")
    extra = asyncio.ensure_future(next_change(changes))
    await asyncio.sleep(0.3)
    assert not extra.done(), "a change outside the prefix woke the watch"
    extra.cancel()
    await asyncio.gather(extra, return_exceptions=True)
    await changes.aclose()


async def test_watch_reconnects_when_etcd_restarts(etcd: EtcdServer) -> None:
    """The watch stream breaks when etcd stops; the watch reconnects (within timeout_s)
    from the revision it had reached, so a change made right after the restart is seen."""
    client = Etcd([etcd.endpoint], timeout_s=10.0)
    changes = client.watch("k")
    try:
        first = asyncio.ensure_future(next_change(changes))
        await asyncio.sleep(0.3)
        await asyncio.to_thread(etcd.restart)
        await client.put("k", b"after the restart")
        await first
    finally:
        await changes.aclose()
        await client.close()


async def test_watch_from_a_revision_sees_earlier_changes(client: Etcd) -> None:
    _, revision = await client.range("k")
    await client.put("k", b"changed after the read")
    changes = client.watch("k", start_revision=revision + 1)
    await next_change(changes)
    await changes.aclose()


async def test_a_dead_endpoint_is_unavailable_within_the_timeout() -> None:
    client = Etcd([f"127.0.0.1:{free_port()}"], timeout_s=1.0)
    started = time.monotonic()
    with pytest.raises(EtcdUnavailable, match="no etcd endpoint answered"):
        await client.get("k")
    assert time.monotonic() - started < 1.5
    await client.close()


async def test_a_paused_endpoint_is_unavailable_within_the_timeout(etcd: EtcdServer) -> None:
    client = Etcd([etcd.endpoint], timeout_s=1.0)
    await client.put("k", b"v")
    etcd.pause()
    try:
        started = time.monotonic()
        with pytest.raises(EtcdUnavailable):
            await client.get("k")
        assert time.monotonic() - started < 1.5
    finally:
        etcd.resume()
    assert await client.get("k") == b"v"
    await client.close()


async def test_the_next_endpoint_is_used_when_the_first_is_dead(etcd: EtcdServer) -> None:
    client = Etcd([f"127.0.0.1:{free_port()}", f"http://{etcd.endpoint}"], timeout_s=2.0)
    await client.put("k", b"v")
    assert await client.get("k") == b"v"
    lease = await client.lease_grant(5)
    assert await client.campaign("e", b"v", lease)
    await client.close()


async def test_a_paused_first_endpoint_leaves_time_for_the_second(
    etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Two independent etcds stand in for two members: with the first paused, a request
    still gets its answer from the second within the timeout."""
    with EtcdServer(tmp_path_factory.mktemp("second-etcd")) as second:
        client = Etcd([etcd.endpoint, second.endpoint], timeout_s=2.0)
        etcd.pause()
        try:
            started = time.monotonic()
            await client.put("k", b"v")
            assert time.monotonic() - started < 2.0
        finally:
            etcd.resume()
        await client.close()
        only_second = Etcd([second.endpoint])
        assert await only_second.get("k") == b"v"
        await only_second.close()


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="no etcd endpoint"):
        Etcd([])
    with pytest.raises(ValueError, match="empty etcd endpoint"):
        Etcd([" "])
    with pytest.raises(ValueError, match="timeout_s"):
        Etcd(["127.0.0.1:2379"], timeout_s=0)
