"""Replication over TLS end to end: `streamq serve --clustering` processes with the
`--clustering-tls-*` flags and a real etcd on loopback.

Goal: a TLS cluster replicates, and a message confirmed before the leader's SIGKILL is on
the new leader; its replication port speaks only TLS (a plain socket's hello gets no
greeting, a TLS client without a certificate gets nothing either) and the leader logs
each refusal; a clear-text node and a node whose certificate comes from another CA are
refused (the leader logs why, the node says why, neither joins the in-sync set); only
some of the three settings stops `streamq serve` at once with a clear message.
Method: tests/cluster/cluster_nodes.py's processes, certificates from
tests/cluster/node_certs.py, every wait bounded.
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pika
import pytest

from streamq.cluster import replication as wire
from tests.cluster.cluster_nodes import ROOT, Cluster, ClusterNode
from tests.cluster.etcd_server import EtcdServer
from tests.cluster.node_certs import NodeFiles, cluster_files, node_pair
from tests.integration.certs import Pair, make_ca

TIMEOUT_S = 30.0
QUEUE = "tls-ha"
MESSAGES = 300
CONFIRM_BOUND_S = 30.0


def wait_log(node: ClusterNode, text: bytes, timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in node.log():
        assert time.monotonic() < deadline, f"{node.name} never logged {text!r}\n{node.log_tail()}"
        time.sleep(0.1)


def publish_confirmed(port: int, count: int) -> None:
    connection = pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", port, socket_timeout=TIMEOUT_S)
    )
    try:
        channel = connection.channel()
        channel.queue_declare(QUEUE, durable=True)
        channel.confirm_delivery()
        for i in range(count):
            channel.basic_publish(
                "", QUEUE, f"m{i}".encode(), pika.BasicProperties(delivery_mode=2)
            )  # raises if nacked or unroutable: each one is confirmed when it returns
    finally:
        connection.close()


def queue_depth(port: int) -> int:
    connection = pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", port, socket_timeout=TIMEOUT_S)
    )
    try:
        declared = connection.channel().queue_declare(QUEUE, durable=True, passive=True)
        return int(declared.method.message_count)
    finally:
        connection.close()


def plain_hello_answer(port: int) -> bytes:
    """What the replication port answers a clear-text follower's hello with."""
    with socket.create_connection(("127.0.0.1", port), TIMEOUT_S) as sock:
        sock.sendall(wire.hello())
        sock.settimeout(TIMEOUT_S)
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
        return answer


def leader_certificate_serial(port: int, ca: Path) -> int:
    """The serial of the certificate the replication port shows now."""
    context = ssl.create_default_context(cafile=str(ca))
    with (
        socket.create_connection(("127.0.0.1", port), TIMEOUT_S) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as sock,
    ):
        certificate = sock.getpeercert()
    assert certificate is not None
    return int(str(certificate["serialNumber"]), 16)


def tls_without_certificate_answer(port: int, ca: Path) -> bytes | str:
    """What a TLS client that trusts the CA but shows no certificate gets: the bytes, or
    the TLS error."""
    context = ssl.create_default_context(cafile=str(ca))
    try:
        with (
            socket.create_connection(("127.0.0.1", port), TIMEOUT_S) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as sock,
        ):
            sock.sendall(wire.hello())
            return sock.recv(4096)
    except (ssl.SSLError, ConnectionResetError) as exc:
        return str(exc)


@pytest.mark.timeout(180)
def test_tls_cluster_replicates_refuses_clear_text_and_keeps_confirmed_messages(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    ca, files = cluster_files(tmp_path / "certs", 3)
    with Cluster(tmp_path / "c", etcd.endpoint, 3) as cluster:
        for node, node_files in zip(cluster.nodes, files, strict=True):
            node.extra = node_files.flags()
        leader = cluster.start()

        # The replication port speaks TLS only, and requires a client certificate.
        answer = plain_hello_answer(leader.clustering_port)  # closed, or a TLS alert
        assert answer[:1] in (b"", bytes([wire.TLS_ALERT_RECORD])), answer
        wait_log(leader, b"clustering: replication port: TLS handshake with 127.0.0.1")
        refused = tls_without_certificate_answer(leader.clustering_port, ca.cert)
        assert isinstance(refused, str) or not refused.startswith(wire.MAGIC), refused
        wait_log(leader, b"peer did not return a certificate")

        # SIGHUP reloads the replication certificate: new connections get the new one.
        leader_files = files[cluster.nodes.index(leader)]
        before = leader_certificate_serial(leader.clustering_port, ca.cert)
        assert before == Pair(leader_files.cert, leader_files.key).serial()
        renewed = node_pair(tmp_path / "certs", ca, "renewed")
        leader_files.cert.write_bytes(renewed.cert.read_bytes())
        leader_files.key.write_bytes(renewed.key.read_bytes())
        os.kill(leader.pid, signal.SIGHUP)
        wait_log(leader, b"clustering TLS certificate reloaded from " + bytes(leader_files.cert))
        assert leader_certificate_serial(leader.clustering_port, ca.cert) == renewed.serial()
        assert leader.alive

        publish_confirmed(leader.amqp_port, MESSAGES)
        leader.kill()
        new = cluster.wait_leader(CONFIRM_BOUND_S, exclude=(leader,))
        assert queue_depth(new.amqp_port) == MESSAGES
        leader.start()  # it comes back as a TLS follower of the new leader
        cluster.wait_in_sync(cluster.nodes, TIMEOUT_S)
        for node in cluster.nodes:  # only the two probes above were refused
            assert b"certificate verify failed" not in node.log()
            assert b"refused replication peer" not in node.log()
            assert b"TLS handshake with the leader" not in node.log()


@pytest.mark.timeout(180)
def test_clear_text_node_and_another_cas_node_do_not_join(etcd: EtcdServer, tmp_path: Path) -> None:
    _ca, (leader_files, good_files) = cluster_files(tmp_path / "certs", 2)
    other_ca = make_ca(tmp_path / "certs", "other-ca")
    stranger = node_pair(tmp_path / "certs", other_ca, "stranger")
    # It trusts the cluster's CA (so it accepts the leader) but shows another CA's cert.
    stranger_files = NodeFiles(stranger.cert, stranger.key, leader_files.ca)
    with Cluster(tmp_path / "c", etcd.endpoint, 4) as cluster:
        leader_node, good, clear, other = cluster.nodes
        leader_node.extra = leader_files.flags()
        good.extra = good_files.flags()
        other.extra = stranger_files.flags()
        cluster.nodes = [leader_node, good]  # start() starts these two and waits for them
        try:
            leader = cluster.start()
        finally:
            cluster.nodes = [leader_node, good, clear, other]  # all stopped on exit
        clear.start()
        other.start()

        wait_log(clear, b"may require TLS (this node has no clustering TLS settings)")
        wait_log(clear, b"the secret was not sent")
        wait_log(leader, b"TLS handshake with 127.0.0.1")
        wait_log(other, b"refused this node's certificate")
        wait_log(leader, b"certificate verify failed")
        # Several retries later (one a second), neither has joined.
        time.sleep(3)
        assert cluster.isr_ids() == {leader.node_id, good.node_id}
        assert clear.node_id not in cluster.isr_ids() and other.node_id not in cluster.isr_ids()


@pytest.mark.parametrize(
    "given",
    [("--clustering-tls-cert",), ("--clustering-tls-cert", "--clustering-tls-key")],
)
def test_serve_refuses_some_of_the_three_settings(tmp_path: Path, given: tuple[str, ...]) -> None:
    argv = [sys.executable, "-m", "streamq", "serve", "--data-dir", str(tmp_path / "d"),
            "--clustering", "--clustering-etcd-endpoints", "127.0.0.1:1"]  # fmt: skip
    for flag in given:
        argv += [flag, str(tmp_path / "x.pem")]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT, check=False
    )
    assert done.returncode == 1
    assert "clustering TLS needs clustering_tls_cert, clustering_tls_key and" in done.stderr
    assert "given without" in done.stderr and "clustering_tls_ca" in done.stderr
