"""SIGHUP reloads the TLS certificate and key of a `streamq serve` process.

Goal: new handshakes get the new pair, the connections open before the signal go on, and
a bad new pair is refused with a log line while the old one stays in use. Method: a
broker subprocess with --amqps-port 0 --cert --key; the test replaces the files (rename
over, as a certificate renewal does), sends SIGHUP, and tells the pairs apart by the
serial number of the certificate each new handshake sees. SIGHUP never stops the broker.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from tests.integration import certs
from tests.integration.broker_process import STARTUP_TIMEOUT_S, BrokerProcess, streamq
from tests.integration.tls_setup import TIMEOUT_S, client_context, handshake, pika_params

AMQPS_LISTENING = re.compile(rb"amqp/ssl=127\.0\.0\.1:(\d+)")


class LogReader:
    """The broker's stderr, read on a thread so that the test can wait for a line."""

    def __init__(self, broker: BrokerProcess) -> None:
        self.broker = broker
        self.text = broker.stderr.decode(errors="replace")
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        stream = self.broker.process.stderr
        assert stream is not None
        for line in iter(stream.readline, b""):
            self.text += line.decode(errors="replace")

    def wait_for(self, text: str, count: int = 1) -> None:
        deadline = time.monotonic() + TIMEOUT_S
        while self.text.count(text) < count:
            assert time.monotonic() < deadline, f"no {text!r} in the log: {self.text}"
            time.sleep(0.02)

    def stop(self) -> int:
        self.broker.process.send_signal(signal.SIGTERM)
        code = self.broker.process.wait(timeout=STARTUP_TIMEOUT_S)
        self._thread.join(STARTUP_TIMEOUT_S)
        return code


def install(pair: certs.Pair, cert: Path, key: Path) -> None:
    """Put `pair` in place the way a renewal does: copy aside, rename over."""
    for source, target in ((pair.cert, cert), (pair.key, key)):
        shutil.copyfile(source, f"{target}.new")
        os.replace(f"{target}.new", target)


def served_serial(port: int, ca: certs.Pair) -> int:
    with handshake(port, client_context(ca)) as sock:
        cert = sock.getpeercert()
    assert cert is not None
    return int(str(cert["serialNumber"]), 16)


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, certs.Pair]:
    d = tmp_path / "pki"
    d.mkdir()
    ca = certs.make_ca(d, "ca")
    return {
        "ca": ca,
        "old": certs.issue(d, ca, "old", cn="localhost"),
        "new": certs.issue(d, ca, "new", cn="localhost"),
    }


@pytest.fixture
def tls_process(tmp_path: Path, pki: dict[str, certs.Pair]) -> Iterator[tuple[LogReader, int]]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    install(pki["old"], cert, key)
    broker = BrokerProcess(
        tmp_path / "data", "--amqps-port", "0", "--cert", str(cert), "--key", str(key)
    )
    match = AMQPS_LISTENING.search(broker.stderr)
    assert match is not None, broker.stderr
    log = LogReader(broker)
    yield log, int(match[1])
    if broker.process.poll() is None:
        log.stop()


def test_sighup_reloads_the_pair_and_keeps_connections(
    tmp_path: Path, pki: dict[str, certs.Pair], tls_process: tuple[LogReader, int]
) -> None:
    log, port = tls_process
    ca = pki["ca"]
    assert served_serial(port, ca) == pki["old"].serial()
    open_before = pika.BlockingConnection(pika_params(port, client_context(ca)))
    channel = open_before.channel()
    channel.confirm_delivery()
    channel.queue_declare("reload")

    install(pki["new"], tmp_path / "cert.pem", tmp_path / "key.pem")
    log.broker.process.send_signal(signal.SIGHUP)
    log.wait_for("TLS certificate reloaded")
    assert served_serial(port, ca) == pki["new"].serial()
    channel.basic_publish("", "reload", b"after the reload")  # the old connection goes on
    method, _, body = channel.basic_get("reload", auto_ack=True)
    assert method is not None and body == b"after the reload"

    # A bad pair: the new certificate with the old key. Refused, the new pair stays.
    shutil.copyfile(pki["old"].key, tmp_path / "key.pem")
    log.broker.process.send_signal(signal.SIGHUP)
    log.wait_for("TLS reload refused, the old certificate stays in use")
    assert "key values mismatch" in log.text
    assert served_serial(port, ca) == pki["new"].serial()
    # A missing file: refused too.
    os.remove(tmp_path / "cert.pem")
    log.broker.process.send_signal(signal.SIGHUP)
    log.wait_for("TLS reload refused", count=2)
    assert served_serial(port, ca) == pki["new"].serial()
    channel.basic_publish("", "reload", b"still open")
    assert channel.basic_get("reload", auto_ack=True)[2] == b"still open"
    open_before.close()
    assert log.broker.process.poll() is None
    assert log.stop() == 0


def test_sighup_without_tls_does_not_stop_the_broker(tmp_path: Path) -> None:
    log = LogReader(BrokerProcess(tmp_path / "data"))
    log.broker.process.send_signal(signal.SIGHUP)
    log.wait_for("SIGHUP: no TLS listener, nothing to reload")
    connection = pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", log.broker.amqp_port, socket_timeout=TIMEOUT_S)
    )
    connection.close()
    assert log.stop() == 0


def test_a_tls_port_without_a_certificate_is_a_start_error(tmp_path: Path) -> None:
    done = subprocess.run(
        streamq(
            "serve",
            "--data-dir",
            str(tmp_path / "d"),
            "--amqps-port",
            "0",
            "--stream-port",
            "-1",
            "--mqtt-port",
            "-1",
        ),
        capture_output=True,
        timeout=STARTUP_TIMEOUT_S,
        check=False,
    )
    assert done.returncode != 0
    assert b"needs tls_cert (--cert)" in done.stderr
