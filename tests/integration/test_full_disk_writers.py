"""ENOSPC on one kind of file at a time, injected into a real `streamq serve` process by
the LD_PRELOAD shim (tests/eio_shim.c with ENOSPC as its write error), driven by pika:
the writes are held and retried in order, confirms wait for them, and everything resumes
without a restart when the fault goes.

- the delayed-message file: a persistent delayed message published with confirms is
  confirmed only after its record is written (the log says it is out of space, then
  that writes resumed), comes out after its delay, and survives SIGKILL and a restart;
- accounts.json: a management call that changes it is refused (503 with the reason),
  the file unchanged; a vhost's definitions file (policies, parameters, exchanges):
  the call is held until there is room, then completes.
"""

from __future__ import annotations

import base64
import errno
import http.client
import json
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


def call(broker: BrokerProcess, method: str, path: str, body: object = None) -> tuple[int, str]:
    connection = http.client.HTTPConnection(HOST, broker.http_port, timeout=TIMEOUT_S)
    auth = base64.b64encode(b"guest:guest").decode()
    headers = {"Authorization": f"Basic {auth}", "Content-Type": "application/json"}
    try:
        connection.request(method, path, json.dumps(body) if body is not None else None, headers)
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def test_a_full_disk_refuses_account_changes_and_holds_definitions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """accounts.json: the call is refused (503 with the reason), the file and the users
    unchanged, and the same call works once there is room. A vhost's definitions file
    (policies, parameters, exchanges): the call waits, held, and completes when the
    fault goes, with no restart."""
    shim = shim_for(tmp_path, monkeypatch, "/definitions")
    data_dir = tmp_path / "data"
    broker = BrokerProcess(data_dir)
    try:
        user = {"password": "secret", "tags": ""}
        assert call(broker, "PUT", "/api/users/u0", user)[0] == 201  # writes the file
        accounts = next(data_dir.rglob("accounts.json"))
        before = accounts.read_bytes()
        shim.fail(writes=True)
        status, reason = call(broker, "PUT", "/api/users/u1", user)
        assert status == 503 and "No space left on device" in reason, (status, reason)
        assert accounts.read_bytes() == before
        assert call(broker, "GET", "/api/users/u1")[0] == 404

        policy = {"pattern": "^a", "definition": {"max-length": 5}}
        answered: list[int] = []
        putting = threading.Thread(
            target=lambda: answered.append(call(broker, "PUT", "/api/policies/%2F/p1", policy)[0])
        )
        putting.start()
        putting.join(HELD_S)
        assert answered == [], "the policy was stored during the fault"
        shim.fail()
        putting.join(TIMEOUT_S)
        assert answered == [201]
        assert call(broker, "PUT", "/api/users/u1", user)[0] == 201
    finally:
        broker.kill()
    assert b"u1" in accounts.read_bytes()
    log = broker.stderr.decode(errors="replace")
    assert "PUT /api/users/u1 not stored" in log and "writes resumed" in log, log
    monkeypatch.delenv("LD_PRELOAD")
    again = BrokerProcess(data_dir)
    try:
        status, body = call(again, "GET", "/api/policies/%2F/p1")
        assert status == 200 and '"max-length": 5' in body.replace(":5", ": 5"), body
    finally:
        again.stop()


def test_short_writes_are_completed_or_held_and_lose_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every write to the vhost's files (segments, queue journals, definitions) writes
    half of what it is given for a while: buffered writes loop until whole, a direct
    segment write that stops short is taken as a full disk (held, retried); once the
    fault goes every confirmed message is there, also after SIGKILL and a restart."""
    shim = shim_for(tmp_path, monkeypatch, "/vhosts/")
    data_dir = tmp_path / "data"
    broker = BrokerProcess(data_dir)
    watchdog = threading.Timer(2 * TIMEOUT_S, broker.process.kill)  # bounds pika's waits
    watchdog.start()
    confirmed = []
    try:
        connection = connect(broker)
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("q", durable=True)
        shim.fail(short=True)
        threading.Timer(HELD_S, shim.fail).start()
        for n in range(200):
            body = f"{n}:".encode() + bytes(n * 50)
            channel.basic_publish("", "q", body, pika.BasicProperties(delivery_mode=2))
            confirmed.append(body)
        channel.queue_declare("q2", durable=True)  # a definitions record, short-written too
        connection.close()
    finally:
        watchdog.cancel()
        broker.kill()
    assert len(confirmed) == 200
    log = broker.stderr.decode(errors="replace")
    assert "has failed" not in log, log
    # The segment's direct write that stopped short: held as a full disk, then resumed.
    assert "a direct write stopped at" in log and "writes resumed" in log, log
    monkeypatch.delenv("LD_PRELOAD")
    again = BrokerProcess(data_dir)
    try:
        connection = connect(again)
        channel = connection.channel()
        got = []
        while (message := channel.basic_get("q", auto_ack=True))[0] is not None:
            got.append(message[2])
        channel.queue_declare("q2", durable=True, passive=True)
        connection.close()
    finally:
        again.stop()
    assert got == confirmed
