"""`streamq ctl backup DIR` takes a consistent copy of a running broker, under load, and a
broker started on the copy has everything the first one had done before the backup.

Method: `streamq serve` as a child process; accounts, a policy, a shovel and a federation
upstream set over the HTTP API; real clients keep working throughout the backup: pika
publishers with confirms into a classic queue and a stream (4 KiB segments, so that sealed
segments are hard-linked), a pika consumer acking every message of the classic queue
(the odd messages go to another queue, which has no consumer) and fencing its acks every
few messages with a passive queue.declare (its Declare-Ok is sent after the acks
before it on the channel were processed), and an offset stored with rstream. The backup
is the real command (`python -m streamq ctl backup`). Then the first broker stops, a new
one starts on the copy, and the checks are those `docs/operations.md` promises:

- every message confirmed before the command started, and not acked by a fenced ack
  before then, is in the classic queue; no message whose ack was fenced before then is;
  nothing else is (every message in it was published; none twice);
- the stream holds, from offset 0 and densely, every message confirmed before the
  command started, in publish order (it may hold later ones: the copy is taken at a
  sync point after the command started);
- the stored offset, users, permissions, vhosts, the policy and the parameters are there;
- the restored broker logs no damage, only at most torn tails (as after a crash).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
import subprocess
import threading
import time
from base64 import b64encode
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import pika
import pytest
from rstream import Consumer

from tests.differential.peers import free_port
from tests.integration.broker_process import BrokerProcess, streamq

HOST = "127.0.0.1"
TIMEOUT_S = 30
LOAD_WARMUP_MIN = 300  # confirms to the queue before the backup starts
LOAD_AFTER_S = 0.5  # the load goes on this long after the backup
WORK = "work"
KEPT = "kept"  # odd messages go here: no consumer
EVENTS = "events"
FENCE_EVERY = 20
STREAM_PORT = re.compile(rb"stream=127\.0\.0\.1:(\d+)")
STORED_OFFSET = 42


def http_call(broker: BrokerProcess, method: str, path: str, body: object = None) -> object:
    connection = http.client.HTTPConnection(HOST, broker.http_port, timeout=TIMEOUT_S)
    token = b64encode(b"guest:guest").decode()
    headers = {"Authorization": f"Basic {token}", "Content-Type": "application/json"}
    try:
        data = None if body is None else json.dumps(body).encode()
        connection.request(method, path, data, headers)
        response = connection.getresponse()
        answer = response.read()
        assert response.status < 300, (method, path, response.status, answer)
        return json.loads(answer) if answer.strip() else None
    finally:
        connection.close()


def ctl(broker: BrokerProcess | None, *args: str, user: str = "guest:guest") -> tuple[int, str]:
    """`streamq ctl ARGS` against `broker`: (exit status, stdout and stderr)."""
    env = dict(os.environ)
    port = broker.http_port if broker is not None else free_port()
    env["STREAMQ_CTL_URI"] = f"http://{user}@{HOST}:{port}"
    done = subprocess.run(
        streamq("ctl", *args), capture_output=True, env=env, timeout=120, check=False
    )
    return done.returncode, (done.stdout + done.stderr).decode()


def stream_port(broker: BrokerProcess) -> int:
    found = STREAM_PORT.search(broker.stderr)
    assert found is not None, broker.stderr
    return int(found[1])


@dataclass
class History:
    """What the clients saw, with monotonic times."""

    published: set[int] = field(default_factory=set)
    confirmed_s: dict[int, float] = field(default_factory=dict)  # queue message -> when
    stream_confirmed_s: dict[int, float] = field(default_factory=dict)
    acked_s: dict[int, float] = field(default_factory=dict)  # basic.ack sent -> when
    fenced_s: dict[int, float] = field(default_factory=dict)  # acked, fenced -> when
    errors: list[BaseException] = field(default_factory=list)


def connect(broker: BrokerProcess) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters(HOST, broker.amqp_port, blocked_connection_timeout=TIMEOUT_S)
    )


def publish(broker: BrokerProcess, queue: str, stop: threading.Event, history: History) -> None:
    connection = connect(broker)
    channel = connection.channel()
    channel.confirm_delivery()
    confirmed = history.confirmed_s if queue == WORK else history.stream_confirmed_s
    n = 0
    try:
        while not stop.is_set():
            if queue == WORK:
                history.published.add(n)
                routed = KEPT if n % 2 else WORK
                channel.basic_publish("", routed, b"work-%08d" % n)
            else:
                channel.basic_publish("", queue, b"%s-%08d" % (queue.encode(), n))
            confirmed[n] = time.monotonic()  # pika raises if it is nacked
            n += 1
    except BaseException as exc:
        history.errors.append(exc)
    finally:
        connection.close()


def consume(broker: BrokerProcess, stop: threading.Event, history: History) -> None:
    """Ack every delivery; every FENCE_EVERY acks, a passive declare: once its reply is
    in, the broker has processed every ack before it."""
    connection = connect(broker)
    channel = connection.channel()
    channel.basic_qos(prefetch_count=50)
    acked: list[int] = []
    try:
        for method, _properties, body in channel.consume(WORK, inactivity_timeout=0.1):
            if stop.is_set():
                break
            if method is None:
                continue
            number = int(body.split(b"-")[1])
            history.acked_s[number] = time.monotonic()
            channel.basic_ack(method.delivery_tag)
            acked.append(number)
            if len(acked) >= FENCE_EVERY:
                channel.queue_declare(WORK, passive=True)
                now = time.monotonic()
                history.fenced_s.update((n, now) for n in acked)
                acked.clear()
    except BaseException as exc:
        history.errors.append(exc)
    finally:
        connection.close()


@pytest.fixture
def loaded(tmp_path: Path) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(tmp_path / "data")
    try:
        yield broker
    finally:
        broker.stop()


def set_up_state(broker: BrokerProcess) -> None:
    http_call(broker, "PUT", "/api/users/alice", {"password": "pw", "tags": "management"})
    http_call(broker, "PUT", "/api/vhosts/v2", {})
    permissions = {"configure": "^a", "write": ".*", "read": ".*"}
    http_call(broker, "PUT", "/api/permissions/v2/alice", permissions)
    policy = {"pattern": "^capped$", "definition": {"max-length": 5}, "apply-to": "queues"}
    http_call(broker, "PUT", "/api/policies/%2F/cap", policy)
    unreachable = "amqp://127.0.0.1:1"
    shovel = {"src-uri": unreachable, "src-queue": "a", "dest-uri": unreachable}
    http_call(broker, "PUT", "/api/parameters/shovel/%2F/sh", {"value": {**shovel,
              "dest-queue": "b"}})  # fmt: skip
    upstream = {"value": {"uri": unreachable}}
    http_call(broker, "PUT", "/api/parameters/federation-upstream/%2F/up", upstream)
    connection = connect(broker)
    channel = connection.channel()
    channel.queue_declare(WORK, durable=True)
    channel.queue_declare(KEPT, durable=True)
    stream_arguments = {"x-queue-type": "stream", "x-stream-max-segment-size-bytes": 4096}
    channel.queue_declare(EVENTS, durable=True, arguments=stream_arguments)
    channel.queue_declare("capped", durable=True)
    connection.close()


async def store_offset(broker: BrokerProcess) -> None:
    consumer = Consumer(HOST, stream_port(broker), username="guest", password="guest")
    await consumer.start()
    try:
        await consumer.store_offset(EVENTS, "app", STORED_OFFSET)
        assert await consumer.query_offset(EVENTS, "app") == STORED_OFFSET
    finally:
        await consumer.close()


async def query_offset(broker: BrokerProcess) -> int:
    consumer = Consumer(HOST, stream_port(broker), username="guest", password="guest")
    await consumer.start()
    try:
        return int(await consumer.query_offset(EVENTS, "app"))
    finally:
        await consumer.close()


def wait_for(condition: object, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def drain_queue(broker: BrokerProcess, queue: str) -> list[int]:
    connection = connect(broker)
    channel = connection.channel()
    found: list[int] = []
    while True:
        method, _properties, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            break
        assert re.fullmatch(rb"work-\d{8}", body), body
        found.append(int(body.split(b"-")[1]))
    connection.close()
    return found


def read_stream(broker: BrokerProcess, count: int) -> list[tuple[int, int]]:
    """(offset, message number) of the stream's first `count` records."""
    connection = connect(broker)
    channel = connection.channel()
    channel.basic_qos(prefetch_count=200)
    records: list[tuple[int, int]] = []
    arguments = {"x-stream-offset": "first"}
    for method, properties, body in channel.consume(
        EVENTS, arguments=arguments, inactivity_timeout=TIMEOUT_S
    ):
        assert method is not None, f"stream stopped after {len(records)} of {count}"
        assert re.fullmatch(rb"events-\d{8}", body), body
        records.append((properties.headers["x-stream-offset"], int(body.split(b"-")[1])))
        channel.basic_ack(method.delivery_tag)
        if len(records) == count:
            break
    connection.close()
    return records


def run_load_and_backup(broker: BrokerProcess, target: Path) -> tuple[History, float, float, str]:
    """Load running, the backup command; (history, when the command started and ended,
    its output)."""
    history = History()
    stop = threading.Event()
    workers = [
        threading.Thread(target=publish, args=(broker, WORK, stop, history)),
        threading.Thread(target=publish, args=(broker, EVENTS, stop, history)),
        threading.Thread(target=consume, args=(broker, stop, history)),
    ]
    for worker in workers:
        worker.start()
    try:
        wait_for(lambda: len(history.confirmed_s) >= LOAD_WARMUP_MIN and history.fenced_s,
                 "the load to warm up")  # fmt: skip
        # Stored just before the command: only the sync point's round writes it in time
        # (on its own, a stored offset is written within STORE_SYNC_DELAY_S).
        asyncio.run(store_offset(broker))
        began_s = time.monotonic()
        status, output = ctl(broker, "backup", str(target))
        ended_s = time.monotonic()
        assert status == 0, output
        time.sleep(LOAD_AFTER_S)
    finally:
        stop.set()
        for worker in workers:
            worker.join(TIMEOUT_S)
    assert not any(worker.is_alive() for worker in workers)
    assert not history.errors, history.errors
    return history, began_s, ended_s, output


def test_a_backup_under_load_restores_everything_done_before_it(
    loaded: BrokerProcess, tmp_path: Path
) -> None:
    set_up_state(loaded)
    target = tmp_path / "backup"
    history, began_s, ended_s, output = run_load_and_backup(loaded, target)
    assert output.startswith(f"Backed up {loaded.data_dir} to {target}"), output
    print(output)
    manifest = json.loads((target / "streamq-backup.json").read_text())
    assert manifest["files_linked"] > 0, manifest  # sealed stream segments
    loaded.stop()

    restored = BrokerProcess(target)
    try:
        check_queue(restored, history, began_s, ended_s)
        check_stream(restored, history, began_s)
        assert asyncio.run(query_offset(restored)) == STORED_OFFSET
        check_definitions(restored)
    finally:
        restored.stop()
    log = restored.stderr.decode(errors="replace")
    assert " ERROR " not in log, log


def check_queue(broker: BrokerProcess, history: History, began_s: float, ended_s: float) -> None:
    """Confirmed before the command: in the copy unless acked before its sync point (which
    is before the command ended). Acked and fenced before the command: not in the copy."""
    kept = drain_queue(broker, KEPT)
    found = drain_queue(broker, WORK)
    assert all(n % 2 for n in kept) and not any(n % 2 for n in found)
    found += kept
    assert len(found) == len(set(found)), "a message twice"
    restored = set(found)
    confirmed = {n for n, at in history.confirmed_s.items() if at < began_s}
    maybe_acked = {n for n, at in history.acked_s.items() if at < ended_s}
    fenced = {n for n, at in history.fenced_s.items() if at < began_s}
    assert any(n % 2 for n in confirmed), "nothing to check: no message in the kept queue"
    missing = confirmed - maybe_acked - restored
    assert not missing, f"{len(missing)} confirmed, unacked messages lost: {sorted(missing)[:10]}"
    resurrected = restored & fenced
    assert not resurrected, f"acked before the backup, restored: {sorted(resurrected)[:10]}"
    assert restored <= history.published


def check_stream(broker: BrokerProcess, history: History, began_s: float) -> None:
    queue = http_call(broker, "GET", f"/api/queues/%2F/{EVENTS}")
    assert isinstance(queue, dict)
    count = int(queue["messages"])
    confirmed = sum(1 for at in history.stream_confirmed_s.values() if at < began_s)
    assert confirmed <= count <= len(history.stream_confirmed_s) + 1
    records = read_stream(broker, count)
    assert records == [(n, n) for n in range(count)]  # dense, in order, nothing lost


def check_definitions(broker: BrokerProcess) -> None:
    user = http_call(broker, "GET", "/api/users/alice")
    assert isinstance(user, dict) and user["tags"] in (["management"], "management")
    vhosts = http_call(broker, "GET", "/api/vhosts")
    assert isinstance(vhosts, list) and {v["name"] for v in vhosts} == {"/", "v2"}
    permission = http_call(broker, "GET", "/api/permissions/v2/alice")
    assert isinstance(permission, dict) and permission["configure"] == "^a"
    policy = http_call(broker, "GET", "/api/policies/%2F/cap")
    assert isinstance(policy, dict) and policy["definition"] == {"max-length": 5}
    shovel = http_call(broker, "GET", "/api/parameters/shovel/%2F/sh")
    assert isinstance(shovel, dict) and shovel["value"]["src-queue"] == "a"
    upstream = http_call(broker, "GET", "/api/parameters/federation-upstream/%2F/up")
    assert isinstance(upstream, dict) and upstream["value"]["uri"] == "amqp://127.0.0.1:1"
    queues = http_call(broker, "GET", f"/api/queues/%2F/{quote('capped')}")
    assert isinstance(queues, dict) and queues["policy"] == "cap"


def test_an_ack_and_an_offset_stored_just_before_the_request_are_in_the_copy(
    loaded: BrokerProcess, tmp_path: Path
) -> None:
    """Neither an ack nor a stored offset has a reply that waits for the disk: each is
    written by the next sync round (within 0.2 s). Made just before `POST /api/backup`
    (over HTTP here: the command's own start-up takes longer than that), both must be in
    the copy, which the sync point's first round guarantees."""
    set_up_state(loaded)
    connection = connect(loaded)
    channel = connection.channel()
    channel.confirm_delivery()
    for n in range(3):
        channel.basic_publish("", WORK, b"work-%08d" % n)
        channel.basic_publish("", EVENTS, b"events-%08d" % n)
    method, _properties, body = channel.basic_get(WORK)
    assert method is not None and body == b"work-00000000"
    channel.basic_ack(method.delivery_tag)
    channel.queue_declare(WORK, passive=True)  # the ack was processed
    asyncio.run(store_offset(loaded))
    target = tmp_path / "backup"
    http_call(loaded, "POST", "/api/backup", {"directory": str(target)})
    connection.close()
    loaded.stop()
    restored = BrokerProcess(target)
    try:
        assert drain_queue(restored, WORK) == [1, 2]
        assert asyncio.run(query_offset(restored)) == STORED_OFFSET
    finally:
        restored.stop()


def test_what_the_command_refuses_and_a_stopped_broker(
    loaded: BrokerProcess, tmp_path: Path
) -> None:
    """Each refusal is one line and an exit status, and leaves DIR as it was; a stopped
    broker is backed up offline (--data-dir), under its lock."""
    http_call(loaded, "PUT", "/api/users/alice", {"password": "pw", "tags": "management"})
    connection = connect(loaded)
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare(WORK, durable=True)
    channel.basic_publish("", WORK, b"work-00000007")
    connection.close()
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep").write_bytes(b"x")
    status, output = ctl(loaded, "backup", str(full))
    assert (status, output) == (1, f"streamq ctl: 400: the backup directory {full} is not empty\n")
    assert [p.name for p in full.iterdir()] == ["keep"]
    inside = loaded.data_dir / "backup"
    status, output = ctl(loaded, "backup", str(inside))
    assert status == 1 and "is inside the data directory" in output, output
    assert not inside.exists()
    status, output = ctl(loaded, "backup", str(tmp_path / "b"), user="alice:pw")
    assert status == 77 and "administrator" in output, output
    assert not (tmp_path / "b").exists()
    status, output = ctl(None, "--data-dir", str(loaded.data_dir), "backup", str(tmp_path / "b"))
    assert status == 1 and f"is running on data directory {loaded.data_dir}" in output, output
    assert not (tmp_path / "b").exists()

    loaded.stop()
    status, output = ctl(loaded, "backup", str(tmp_path / "b"))
    assert status == 69, output
    assert "no broker answers" in output and "give --data-dir DATA" in output, output
    status, output = ctl(None, "--data-dir", str(loaded.data_dir), "backup", str(tmp_path / "b"))
    assert status == 0 and output.startswith(f"Backed up {loaded.data_dir}"), output
    manifest = json.loads((tmp_path / "b" / "streamq-backup.json").read_text())
    assert manifest["online"] is False
    restored = BrokerProcess(tmp_path / "b")
    try:
        assert drain_queue(restored, WORK) == [7]
    finally:
        restored.stop()
