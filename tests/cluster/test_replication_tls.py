"""The replication link over TLS, in process on uvloop (as the broker runs) over real
loopback sockets, with real certificates: a TLS leader and follower sync and stream; what
crosses the wire (recorded by a relay between them) is a TLS handshake first and never
the secret; a clear-text follower, a follower with another CA's certificate and a TLS
follower of a clear-text leader are each refused, with a clear reason logged on both
sides and no hang; only some of the three settings, or a bad file, is refused at start."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final, TypeVar

import pytest
import uvloop

from streamq.app import ServeConfig, ServeError
from streamq.cluster import replication as wire
from streamq.cluster.link_tls import LinkTls, link_tls
from streamq.cluster.replication import ReplicationError
from tests.cluster.node_certs import NodeFiles, cluster_files, node_pair
from tests.cluster.replication_helpers import (
    SECRET,
    Follower,
    Leader,
    MemoryIsrStore,
    Relay,
    eventually,
    tree,
)
from tests.integration.certs import make_ca

pytestmark = pytest.mark.timeout(120)
T = TypeVar("T")
TEST_TIMEOUT_S: Final = 60.0
REFUSAL_TIMEOUT_S: Final = 8.0  # well under the handshake timeouts (10 s): no hang


def run(main: Callable[[], Awaitable[T]]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(main(), TEST_TIMEOUT_S)

    return uvloop.run(bounded())


def tls_of(files: NodeFiles) -> LinkTls:
    config = ServeConfig(
        clustering_tls_cert=str(files.cert),
        clustering_tls_key=str(files.key),
        clustering_tls_ca=str(files.ca),
    )
    made = link_tls(config)
    assert made is not None
    return made


class RecordingRelay(Relay):
    """A loopback relay that keeps every byte each way (what a capture on the loopback
    interface between the two nodes would show)."""

    def __init__(self, target_port: int) -> None:
        super().__init__(target_port)
        self.upstream = bytearray()  # follower -> leader
        self.downstream = bytearray()  # leader -> follower

    def carried(self, data: bytes, *, upstream: bool) -> None:
        (self.upstream if upstream else self.downstream).extend(data)


async def refusal(follower: Follower) -> str:
    """The reason the follower's run() ended with, bounded."""
    with pytest.raises(ReplicationError) as caught:
        await asyncio.wait_for(follower.task, REFUSAL_TIMEOUT_S)
    return caught.value.reason


def logged(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(record.getMessage() for record in caplog.records)


def test_tls_leader_and_follower_replicate_and_the_secret_stays_encrypted(
    tmp_path: Path,
) -> None:
    _ca, (leader_files, follower_files) = cluster_files(tmp_path / "certs", 2)

    async def main() -> tuple[bytearray, bytearray]:
        store = MemoryIsrStore()
        leader = Leader(tmp_path / "leader", store, tls=tls_of(leader_files).server)
        leader.workload.mixed(30)
        await leader.start()
        relay = await RecordingRelay(leader.port).start()
        follower = Follower(tmp_path / "f1", "f1", relay.uri, tls=tls_of(follower_files).client)
        try:
            await eventually(lambda: follower.client.synced)
            leader.workload.mixed(30, seed=30)
            position = leader.tap.position
            await eventually(lambda: follower.client.acked >= position)
            assert tree(follower.root) == tree(leader.root)
            await eventually(lambda: store.isr == {"leader", "f1"})
        finally:
            await follower.stop()
            await leader.server.close()
            await relay.close()
        return relay.upstream, relay.downstream

    upstream, downstream = run(main)
    # Both ways the first bytes are a TLS handshake record: the follower's ClientHello,
    # the leader's ServerHello. Neither the secret nor the protocol's magic ever crosses
    # in clear (the segment bytes would show as runs of one byte value).
    assert upstream[0] == wire.TLS_HANDSHAKE_RECORD and upstream[1] == 3
    assert downstream[0] == wire.TLS_HANDSHAKE_RECORD and downstream[1] == 3
    for sent in (upstream, downstream):
        assert SECRET.encode() not in sent
        assert wire.MAGIC not in sent
        assert b"journal 1" not in sent


def test_clear_text_follower_is_refused_by_a_tls_leader_without_sending_the_secret(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _ca, (leader_files,) = cluster_files(tmp_path / "certs", 1)
    caplog.set_level(logging.INFO)

    async def main() -> tuple[str, bytearray, frozenset[str] | None]:
        store = MemoryIsrStore()
        leader = await Leader(tmp_path / "leader", store, tls=tls_of(leader_files).server).start()
        relay = await RecordingRelay(leader.port).start()
        follower = Follower(tmp_path / "f1", "f1", relay.uri)
        try:
            reason = await refusal(follower)
        finally:
            await follower.stop()
            await leader.server.close()
            await relay.close()
        return reason, relay.upstream, store.isr

    reason, upstream, isr = run(main)
    # The leader's TLS layer closes at the first bytes, which are no TLS record.
    assert "may require TLS" in reason and "the secret was not sent" in reason, reason
    assert bytes(upstream) == wire.hello()  # its hello only: no secret, no node id
    assert isr is None or "f1" not in isr
    assert "clustering: replication port: TLS handshake with 127.0.0.1" in logged(caplog)


def test_follower_with_another_cas_certificate_is_refused_by_the_leader(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _ca, (leader_files,) = cluster_files(tmp_path / "certs", 1)
    # The follower trusts the leader's CA but shows a certificate from another CA.
    other_ca = make_ca(tmp_path / "certs", "other-ca")
    stranger = node_pair(tmp_path / "certs", other_ca, "stranger")
    stranger_files = NodeFiles(stranger.cert, stranger.key, leader_files.ca)
    caplog.set_level(logging.INFO)

    async def main() -> tuple[str, frozenset[str] | None, list[str]]:
        store = MemoryIsrStore()
        leader = await Leader(tmp_path / "leader", store, tls=tls_of(leader_files).server).start()
        follower = Follower(tmp_path / "f1", "f1", leader.uri, tls=tls_of(stranger_files).client)
        try:
            reason = await refusal(follower)
        finally:
            await follower.stop()
            await leader.server.close()
        return reason, store.isr, [status.node_id for status in leader.server.followers()]

    reason, isr, followers = run(main)
    assert isr is None or "f1" not in isr
    assert followers == []
    assert "certificate verify failed" in logged(caplog), logged(caplog)
    assert "refused this node's certificate" in reason, reason
    assert "the secret was not sent" in reason, reason


def test_follower_refuses_a_leader_certificate_from_another_ca(tmp_path: Path) -> None:
    _ca, (leader_files,) = cluster_files(tmp_path / "certs", 1)
    other_ca = make_ca(tmp_path / "certs", "other-ca")
    other = node_pair(tmp_path / "certs", other_ca, "other")
    follower_files = NodeFiles(other.cert, other.key, other_ca.cert)

    async def main() -> str:
        leader = Leader(tmp_path / "leader", MemoryIsrStore(), tls=tls_of(leader_files).server)
        await leader.start()
        follower = Follower(tmp_path / "f1", "f1", leader.uri, tls=tls_of(follower_files).client)
        try:
            return await refusal(follower)
        finally:
            await follower.stop()
            await leader.server.close()

    reason = run(main)
    assert "TLS handshake with the leader" in reason and "certificate verify failed" in reason


def test_follower_checks_the_leader_certificate_for_the_advertised_host(tmp_path: Path) -> None:
    """The leader's certificate names another host than the URI the follower dials."""
    ca, (follower_files,) = cluster_files(tmp_path / "certs", 1)
    elsewhere = node_pair(tmp_path / "certs", ca, "elsewhere", san="DNS:node9.example")
    leader_files = NodeFiles(elsewhere.cert, elsewhere.key, follower_files.ca)

    async def main() -> str:
        leader = Leader(tmp_path / "leader", MemoryIsrStore(), tls=tls_of(leader_files).server)
        await leader.start()
        follower = Follower(tmp_path / "f1", "f1", leader.uri, tls=tls_of(follower_files).client)
        try:
            return await refusal(follower)
        finally:
            await follower.stop()
            await leader.server.close()

    reason = run(main)
    assert "certificate verify failed" in reason, reason
    assert "certificate is not valid for '127.0.0.1'" in reason, reason


def test_tls_follower_of_a_clear_text_leader_is_refused_on_both_sides(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _ca, (follower_files,) = cluster_files(tmp_path / "certs", 1)
    caplog.set_level(logging.INFO)

    async def main() -> str:
        leader = await Leader(tmp_path / "leader", MemoryIsrStore()).start()
        follower = Follower(tmp_path / "f1", "f1", leader.uri, tls=tls_of(follower_files).client)
        try:
            return await refusal(follower)
        finally:
            await follower.stop()
            await leader.server.close()

    reason = run(main)
    assert "TLS handshake with the leader" in reason or "does the leader speak TLS" in reason
    assert "the peer speaks TLS and this node's replication port is clear text" in logged(caplog)


def test_some_of_the_three_settings_or_a_bad_file_are_refused(tmp_path: Path) -> None:
    _ca, (files,) = cluster_files(tmp_path / "certs", 1)
    full = ServeConfig(
        clustering_tls_cert=str(files.cert),
        clustering_tls_key=str(files.key),
        clustering_tls_ca=str(files.ca),
    )
    assert link_tls(ServeConfig()) is None
    assert link_tls(full) is not None
    with pytest.raises(ServeError, match="given without clustering_tls_key, clustering_tls_ca"):
        link_tls(dataclasses.replace(full, clustering_tls_key="", clustering_tls_ca=""))
    with pytest.raises(ServeError, match="clustering_tls_key given without clustering_tls_ca"):
        link_tls(dataclasses.replace(full, clustering_tls_ca=""))
    with pytest.raises(ServeError, match=r"clustering_tls_ca '/nonexistent\.pem'"):
        link_tls(dataclasses.replace(full, clustering_tls_ca="/nonexistent.pem"))
    with pytest.raises(ServeError, match="key values mismatch"):
        other_key = str(files.ca).replace(".pem", ".key")  # the CA's key
        link_tls(dataclasses.replace(full, clustering_tls_key=other_key))


def test_reload_swaps_the_contexts_and_a_file_that_fails_keeps_the_old(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ca, (files,) = cluster_files(tmp_path / "certs", 1)
    link = tls_of(files)
    first = link.server, link.client
    renewed = node_pair(tmp_path / "certs", ca, "renewed")
    files.cert.write_bytes(renewed.cert.read_bytes())
    files.key.write_bytes(renewed.key.read_bytes())
    assert link.reload()
    second = link.server, link.client
    assert second[0] is not first[0] and second[1] is not first[1]
    files.cert.write_text("not a certificate\n")
    assert not link.reload()
    assert (link.server, link.client) == second
    assert "the old replication certificate stays in use" in logged(caplog)
