"""Write a data-directory fixture: a broker of a given commit, filled through real clients.

Starts `streamq serve` of a commit (default: this checkout; any other commit or tag is
checked out with `git worktree add` into a temporary directory and its C modules built
there) on loopback with a fresh data directory, fills it with every kind of state through
real clients (pika for AMQP, rstream for the stream protocol, the HTTP API for users,
vhosts, policies and parameters), then stops it (SIGKILL, or SIGTERM for the `clean`
variant) and packs the data directory as `tests/upgrade/data/<name>-<variant>.tar.gz`
beside `<name>-<variant>.json`, a manifest of what it holds, which
tests/upgrade/test_data_directories.py checks against today's broker.

    python tools/make_datadir_fixture.py                       # this checkout, both variants
    python tools/make_datadir_fixture.py --commit v0.9.0 --name 0.9.0 --variant kill

Run it with the venv that has pika and rstream (the test extra).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

import pika
from rstream import AMQPMessage, Consumer, Producer

ROOT: Final = Path(__file__).resolve().parent.parent
OUT_DIR: Final = ROOT / "tests" / "upgrade" / "data"
HOST: Final = "127.0.0.1"
START_TIMEOUT_S: Final = 30
STOP_TIMEOUT_S: Final = 30
CLIENT_TIMEOUT_S: Final = 10
OFFSET_DURABLE_WAIT_S: Final = 1.5  # a stored stream offset is synced within 0.2 s
ACK_DURABLE_WAIT_S: Final = 1.0  # acks reach a sync round within 200 ms
STREAM_SEGMENT_BYTES: Final = 4096  # small segments: several per stream, a small tarball
NOWHERE: Final = "amqp://127.0.0.1:1"  # shovels and upstreams are definitions only
FORMAT: Final = 1  # of the manifest
GUEST: Final = ("guest", "guest")


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


class Broker:
    """`streamq serve` of the source tree `source` on fixed loopback ports."""

    def __init__(self, source: Path, data_dir: Path, log: Path) -> None:
        self.amqp_port, self.http_port, self.stream_port = free_port(), free_port(), free_port()
        env = dict(os.environ, PYTHONPATH=str(source))
        ports = ("--amqp-port", str(self.amqp_port), "--http-port", str(self.http_port))
        self.log = log.open("ab")
        self.process = subprocess.Popen(
            [
                *(sys.executable, "-m", "streamq", "serve", "--data-dir", str(data_dir)),
                *ports,
                *("--stream-port", str(self.stream_port), "--stream-advertised-host", HOST),
            ],
            cwd=source,
            env=env,
            stderr=self.log,
        )
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert self.process.poll() is None, f"broker exited, see {self.log.name}"
            with contextlib.suppress(OSError):
                if self.http("GET", "/api/overview")[0] == 200:
                    with socket.create_connection((HOST, self.stream_port), timeout=1):
                        return
            assert time.monotonic() < deadline, f"broker did not start, see {self.log.name}"
            time.sleep(0.1)

    def http(self, method: str, path: str, body: object = None) -> tuple[int, Any]:
        connection = http.client.HTTPConnection(HOST, self.http_port, timeout=CLIENT_TIMEOUT_S)
        auth = base64.b64encode(b"%s:%s" % tuple(s.encode() for s in GUEST)).decode()
        headers = {"Authorization": f"Basic {auth}", "Content-Type": "application/json"}
        payload = None if body is None else json.dumps(body)
        try:
            connection.request(method, path, payload, headers)
            response = connection.getresponse()
            raw = response.read()
        finally:
            connection.close()
        return response.status, (json.loads(raw) if raw.strip() else None)

    def put(self, path: str, body: object) -> None:
        status, answer = self.http("PUT", path, body)
        assert status in (200, 201, 204), f"PUT {path}: {status} {answer}"

    def stop(self, signum: int) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signum)
        self.process.wait(timeout=STOP_TIMEOUT_S)
        self.log.close()


def q(name: str) -> str:
    return quote(name, safe="")


def amqp(broker: Broker, vhost: str = "/", user: tuple[str, str] = GUEST) -> Any:
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            HOST,
            broker.amqp_port,
            vhost,
            pika.PlainCredentials(*user),
            blocked_connection_timeout=CLIENT_TIMEOUT_S,
        )
    )


# -- accounts, policies and parameters over the HTTP API ---------------------------------

USERS: Final[list[dict[str, Any]]] = [
    {"name": "alice", "password": "alice-pw", "tags": ["management", "policymaker"]},
    {"name": "bob", "password": "bob-pw", "tags": ["monitoring"]},
    {"name": "carol", "password": "carol-pw", "tags": []},
]
VHOSTS: Final = ["/", "fixture-a", "fixture b/ü"]
PERMISSIONS: Final[list[dict[str, Any]]] = [
    {"user": "alice", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"},
    {"user": "alice", "vhost": "fixture-a", "configure": "^a\\.", "write": ".*", "read": ".*"},
    {"user": "bob", "vhost": "fixture b/ü", "configure": "", "write": "", "read": ".*"},
    {"user": "carol", "vhost": "/", "configure": "", "write": ".*", "read": ""},
]
TOPIC_PERMISSIONS: Final[list[dict[str, Any]]] = [
    # carol may publish to amq.topic only with keys starting "carol."
    {"user": "carol", "vhost": "/", "exchange": "amq.topic", "write": "^carol\\.", "read": ".*"},
]
POLICIES: Final[list[dict[str, Any]]] = [
    {
        "vhost": "/",
        "name": "ttl-policy",
        "pattern": "^ttl\\.",
        "apply-to": "queues",
        "definition": {"message-ttl": 3600000},
        "priority": 1,
        "queue": "ttl.q",
    },
    {
        "vhost": "fixture-a",
        "name": "len-policy",
        "pattern": "^a\\.",
        "apply-to": "queues",
        "definition": {"max-length": 100},
        "priority": 0,
        "queue": "a.q",
    },
]
OPERATOR_POLICIES: Final[list[dict[str, Any]]] = [
    {
        "vhost": "/",
        "name": "op-policy",
        "pattern": "^op\\.",
        "apply-to": "queues",
        "definition": {"max-length": 50},
        "priority": 0,
        "queue": "op.q",
    },
]
PARAMETERS: Final[list[dict[str, Any]]] = [
    {
        "component": "shovel",
        "vhost": "/",
        "name": "fixture-shovel",
        "value": {
            "src-uri": NOWHERE,
            "src-queue": "shovel.src",
            "dest-uri": NOWHERE,
            "dest-queue": "shovel.dst",
        },
    },
    {
        "component": "federation-upstream",
        "vhost": "/",
        "name": "fixture-upstream",
        "value": {"uri": NOWHERE, "max-hops": 2},
    },
]


def fill_accounts(broker: Broker) -> None:
    for vhost in VHOSTS[1:]:
        broker.put(f"/api/vhosts/{q(vhost)}", {})
    for user in USERS:
        body = {"password": user["password"], "tags": ",".join(user["tags"])}
        broker.put(f"/api/users/{q(user['name'])}", body)
    for p in PERMISSIONS:
        body = {k: p[k] for k in ("configure", "write", "read")}
        broker.put(f"/api/permissions/{q(p['vhost'])}/{q(p['user'])}", body)
    for t in TOPIC_PERMISSIONS:
        body = {k: t[k] for k in ("exchange", "write", "read")}
        broker.put(f"/api/topic-permissions/{q(t['vhost'])}/{q(t['user'])}", body)
    for kind, policies in (("policies", POLICIES), ("operator-policies", OPERATOR_POLICIES)):
        for p in policies:
            body = {k: p[k] for k in ("pattern", "apply-to", "definition", "priority")}
            broker.put(f"/api/{kind}/{q(p['vhost'])}/{q(p['name'])}", body)
    for m in PARAMETERS:
        path = f"/api/parameters/{m['component']}/{q(m['vhost'])}/{q(m['name'])}"
        broker.put(path, {"value": m["value"]})


# -- exchanges, queues and messages over AMQP --------------------------------------------

PRIORITIES: Final = [1, 5, 9, 0, 5, 9]


def fill_amqp(broker: Broker, manifest: dict[str, Any]) -> Any:
    """Everything of AMQP but the delayed messages; returns the open connection whose
    channel holds unacked deliveries of `fx.classic` (kept open until the stop)."""
    exchanges = manifest["exchanges"]
    bindings = manifest["bindings"]
    queues = manifest["queues"]
    connection = amqp(broker)
    ch = connection.channel()
    ch.confirm_delivery()

    def exchange(name: str, kind: str, arguments: dict[str, Any] | None = None) -> None:
        ch.exchange_declare(name, kind, durable=True, arguments=arguments)
        exchanges.append({"vhost": "/", "name": name, "type": kind, "arguments": arguments or {}})

    def queue(name: str, arguments: dict[str, Any] | None = None, vhost_ch: Any = None) -> None:
        (vhost_ch or ch).queue_declare(name, durable=True, arguments=arguments)

    def bind(dest: str, source: str, key: str, args: dict[str, Any] | None = None) -> None:
        is_exchange = any(e["name"] == dest for e in exchanges)
        if is_exchange:
            ch.exchange_bind(dest, source, key, arguments=args)
        else:
            ch.queue_bind(dest, source, key, arguments=args)
        kind = "exchange" if is_exchange else "queue"
        bindings.append(
            {"vhost": "/", "source": source, "destination": dest, "destination_type": kind}
            | {"routing_key": key, "arguments": args or {}}
        )

    def publish(exchange_name: str, key: str, body: str, **props: Any) -> None:
        properties = pika.BasicProperties(delivery_mode=2, **props)
        ch.basic_publish(exchange_name, key, body.encode(), properties, mandatory=True)

    exchange("fx.topic", "topic")
    exchange("fx.headers", "headers")
    exchange("fx.e2e", "fanout")
    exchange("fx.dlx", "direct")
    for name in ("fx.classic", "fx.topic.q", "fx.headers.q", "fx.e2e.q", "fx.dead"):
        queue(name)
    queue("fx.priority", {"x-max-priority": 10})
    ttl_args = {
        "x-message-ttl": 3600000,
        "x-dead-letter-exchange": "fx.dlx",
        "x-dead-letter-routing-key": "dead",
    }
    queue("fx.ttl", ttl_args)
    queue("ttl.q")
    queue("op.q")
    bind("fx.topic.q", "fx.topic", "t.*")
    bind("fx.e2e", "fx.topic", "e2e.#")
    bind("fx.e2e.q", "fx.e2e", "")
    bind("fx.headers.q", "fx.headers", "", {"x-match": "all", "kind": "fixture"})
    bind("fx.dead", "fx.dlx", "dead")

    def expect(name: str, bodies: list[str], **more: Any) -> dict[str, Any]:
        entry = {"vhost": "/", "name": name, "messages": [{"body": b} for b in bodies]}
        entry |= more
        queues.append(entry)
        return entry

    for n in range(8):
        publish("", "fx.classic", f"classic-{n}")
    for n, priority in enumerate(PRIORITIES):
        publish("", "fx.priority", f"prio-{n}-p{priority}", priority=priority)
    publish("fx.topic", "t.one", "topic-1")
    publish("fx.topic", "e2e.deep.key", "e2e-1")
    publish("fx.headers", "", "headers-1", headers={"kind": "fixture"})
    publish("", "fx.ttl", "ttl-kept")
    publish("", "fx.ttl", "ttl-rejected")
    publish("", "ttl.q", "policy-ttl-1")
    publish("", "op.q", "op-1")

    # fx.ttl: the second message is rejected, dead-lettered to fx.dead with x-death; the
    # first is requeued (redelivered from then on).
    got = [ch.basic_get("fx.ttl") for _ in range(2)]
    assert [g[2] for g in got] == [b"ttl-kept", b"ttl-rejected"], got
    ch.basic_reject(got[1][0].delivery_tag, requeue=False)
    ch.basic_reject(got[0][0].delivery_tag, requeue=True)
    ch.close()
    expect("fx.ttl", ["ttl-kept"], redelivered=[True], arguments=ttl_args)
    expect("fx.dead", ["ttl-rejected"], x_death_queue="fx.ttl")

    # fx.classic: 0-2 acked (in a transaction, on disk), 3-5 delivered and unacked at the
    # stop (redelivered after), 6-7 never delivered.
    ch = connection.channel()
    ch.basic_qos(prefetch_count=0)
    ch.tx_select()
    deliveries = [ch.basic_get("fx.classic") for _ in range(6)]
    assert [d[2] for d in deliveries] == [f"classic-{n}".encode() for n in range(6)]
    for method, _, _ in deliveries[:3]:
        ch.basic_ack(method.delivery_tag)
    ch.tx_commit()
    bodies = [f"classic-{n}" for n in range(3, 8)]
    expect("fx.classic", bodies, redelivered=[True, True, True, False, False])

    order = sorted(range(len(PRIORITIES)), key=lambda n: (-PRIORITIES[n], n))
    prio_bodies = [f"prio-{n}-p{PRIORITIES[n]}" for n in order]
    expect("fx.priority", prio_bodies, priorities=[PRIORITIES[n] for n in order])
    expect("fx.topic.q", ["topic-1"])
    expect("fx.e2e.q", ["e2e-1"])
    expect("fx.headers.q", ["headers-1"])
    expect("ttl.q", ["policy-ttl-1"])
    expect("op.q", ["op-1"])
    return connection


def fill_other_vhost(broker: Broker, manifest: dict[str, Any]) -> None:
    """fixture-a: a queue filled by alice (her permissions there)."""
    connection = amqp(broker, "fixture-a", ("alice", "alice-pw"))
    ch = connection.channel()
    ch.confirm_delivery()
    ch.queue_declare("a.q", durable=True)
    bodies = [f"a-{n}" for n in range(3)]
    for body in bodies:
        ch.basic_publish("", "a.q", body.encode(), pika.BasicProperties(delivery_mode=2))
    connection.close()
    entry = {"vhost": "fixture-a", "name": "a.q", "messages": [{"body": b} for b in bodies]}
    manifest["queues"].append(entry)


DELAYS_MS: Final = [1500, 2**32 - 1]  # due soon after the stop; due in ~49 days


def fill_delayed(broker: Broker, manifest: dict[str, Any]) -> None:
    connection = amqp(broker)
    ch = connection.channel()
    ch.confirm_delivery()
    args = {"x-delayed-type": "direct"}
    ch.exchange_declare("fx.delayed", "x-delayed-message", durable=True, arguments=args)
    ch.queue_declare("fx.delayed.q", durable=True)
    ch.queue_bind("fx.delayed.q", "fx.delayed", "later")
    manifest["exchanges"].append(
        {"vhost": "/", "name": "fx.delayed", "type": "x-delayed-message", "arguments": args}
    )
    for n, delay in enumerate(DELAYS_MS):
        properties = pika.BasicProperties(delivery_mode=2, headers={"x-delay": delay})
        published_ms = int(time.time() * 1000)
        ch.basic_publish("fx.delayed", "later", f"delayed-{n}".encode(), properties)
        manifest["delayed"].append(
            {"vhost": "/", "exchange": "fx.delayed", "queue": "fx.delayed.q"}
            | {"body": f"delayed-{n}", "due_ms": published_ms + delay}
        )
    connection.close()


# -- streams over the stream protocol ----------------------------------------------------


async def fill_streams(broker: Broker, manifest: dict[str, Any]) -> None:
    name, reference, tracked = "fx.stream", "fx-producer", "fx-reader"
    producer = Producer(HOST, broker.stream_port, username="guest", password="guest")
    await producer.start()
    try:
        arguments = {"stream-max-segment-size-bytes": str(STREAM_SEGMENT_BYTES)}
        await producer.create_stream(name, arguments=arguments)
        bodies = [f"stream-{n:03d}-" + "x" * 200 for n in range(60)]
        for start in range(0, len(bodies), 20):
            batch = [AMQPMessage(body=b.encode()) for b in bodies[start : start + 20]]
            await _send_confirmed(producer, name, batch, reference)
        client = await producer.default_client
        sequence = await client.query_publisher_sequence(name, reference)
    finally:
        await producer.close()
    consumer = Consumer(HOST, broker.stream_port, username="guest", password="guest")
    await consumer.start()
    try:
        await consumer.store_offset(name, tracked, 41)
        assert await consumer.query_offset(name, tracked) == 41
    finally:
        await consumer.close()
    manifest["streams"].append(
        {"vhost": "/", "name": name, "records": bodies}
        | {"offsets": {tracked: 41}, "publishers": {reference: sequence}}
    )


async def _send_confirmed(producer: Producer, stream: str, batch: list[Any], ref: str) -> None:
    done = asyncio.Event()
    confirmed: list[Any] = []

    async def on_confirm(status: Any) -> None:
        confirmed.append(status)
        if len(confirmed) >= len(batch):
            done.set()

    await producer.send_batch(stream, batch, ref, on_confirm)
    await asyncio.wait_for(done.wait(), CLIENT_TIMEOUT_S)
    assert all(s.is_confirmed for s in confirmed), confirmed


# -- the whole run -----------------------------------------------------------------------


def fill(broker: Broker, manifest: dict[str, Any]) -> Any:
    fill_accounts(broker)
    held = fill_amqp(broker, manifest)
    fill_other_vhost(broker, manifest)
    asyncio.run(fill_streams(broker, manifest))
    time.sleep(max(OFFSET_DURABLE_WAIT_S, ACK_DURABLE_WAIT_S))  # bounded: the sync rounds
    fill_delayed(broker, manifest)  # last: the short delay is still pending at the stop
    return held


def make(source: Path, name: str, variant: str, commit: str, out_dir: Path) -> Path:
    with tempfile.TemporaryDirectory(prefix="streamq-fixture-") as tmp:
        data_dir = Path(tmp) / "data"
        manifest: dict[str, Any] = {
            "format": FORMAT,
            "made_by": name,
            "commit": commit,
            "variant": variant,
            "made_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "users": USERS,
            "vhosts": VHOSTS,
            "permissions": PERMISSIONS,
            "topic_permissions": TOPIC_PERMISSIONS,
            "policies": POLICIES,
            "operator_policies": OPERATOR_POLICIES,
            "parameters": PARAMETERS,
            "exchanges": [],
            "bindings": [],
            "queues": [],
            "delayed": [],
            "streams": [],
        }
        broker = Broker(source, data_dir, Path(tmp) / "broker.log")
        try:
            held = fill(broker, manifest)
        except BaseException:
            broker.stop(signal.SIGKILL)
            sys.stderr.write((Path(tmp) / "broker.log").read_text(errors="replace")[-4000:])
            raise
        broker.stop(signal.SIGKILL if variant == "kill" else signal.SIGTERM)
        with contextlib.suppress(Exception):
            held.close()
        (data_dir / ".lock").unlink(missing_ok=True)
        out_dir.mkdir(parents=True, exist_ok=True)
        stem = out_dir / f"{name}-{variant}"
        with tarfile.open(f"{stem}.tar.gz", "w:gz", compresslevel=9) as tar:
            tar.add(data_dir, arcname="data", filter=_normalised)
        Path(f"{stem}.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
        return Path(f"{stem}.tar.gz")


def _normalised(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def git(where: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(where), *args], capture_output=True, check=True)
    return done.stdout.decode().strip()


@contextlib.contextmanager
def checkout(commit: str | None) -> Iterator[tuple[Path, str]]:
    """The source tree of `commit` (None: this checkout) with its C modules built, and
    the commit's hash."""
    if commit is None:
        yield ROOT, git(ROOT, "rev-parse", "HEAD")
        return
    tmp = Path(tempfile.mkdtemp(prefix="streamq-src-"))
    tree = tmp / "src"
    git(ROOT, "worktree", "add", "--detach", str(tree), commit)
    try:
        build = [sys.executable, "setup.py", "-q", "build_ext", "--inplace"]
        subprocess.run(build, cwd=tree, check=True)
        yield tree, git(tree, "rev-parse", "HEAD")
    finally:
        git(ROOT, "worktree", "remove", "--force", str(tree))
        shutil.rmtree(tmp, ignore_errors=True)


def version_of(source: Path) -> str:
    env = dict(os.environ, PYTHONPATH=str(source))
    command = [sys.executable, "-m", "streamq", "--version"]
    done = subprocess.run(command, cwd=source, env=env, capture_output=True, check=True)
    return done.stdout.decode().split()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commit", help="a commit or tag (default: this checkout)")
    parser.add_argument("--name", help="the fixture's name (default: version-shortcommit)")
    parser.add_argument("--variant", choices=("kill", "clean", "both"), default="both")
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR)
    options = parser.parse_args()
    with checkout(options.commit) as (source, commit):
        name = options.name or f"{version_of(source)}-{commit[:10]}"
        variants = ("kill", "clean") if options.variant == "both" else (options.variant,)
        for variant in variants:
            path = make(source, name, variant, commit, options.out_dir)
            print(f"{path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
