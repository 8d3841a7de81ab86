"""MQTT through streamq and RabbitMQ 3.10's MQTT plugin, side by side in one run.

Two scenarios per broker, with paho-mqtt (one client process, so the client's own speed
is part of every number; both brokers get the same client): `qos1-publish` publishes
`--messages` QoS 1 messages with up to `--inflight` unacknowledged and waits for every
PUBACK (streamq's go out after the fsync, RabbitMQ's after its confirm); `qos0-fanout`
publishes QoS 0 to a QoS 0 subscriber and waits until it has them all. Each broker runs
on loopback ports of its own, its data in a temporary directory, and is stopped after.
Prints messages/s, the machine, and `uptime`'s load (numbers on a loaded machine are
noisy: compare within one run only).

    python -m benchmarks.mqtt_publish --messages 20000
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from benchmarks.machine import cpu_model
from tests.differential.peers import RabbitMQServer, free_port

WAIT_S = 300.0
PAYLOAD = b"x" * 100


def client(port: int, client_id: str, inflight: int) -> mqtt.Client:
    paho = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id)
    paho.username_pw_set("guest", "guest")
    paho.max_inflight_messages_set(inflight)
    paho.max_queued_messages_set(0)
    connected = threading.Event()
    paho.on_connect = lambda *_a: connected.set()
    paho.connect("127.0.0.1", port, 60)
    paho.loop_start()
    assert connected.wait(30), "no CONNACK"
    return paho


def qos1_publish(port: int, messages: int, inflight: int) -> float:
    paho = client(port, "bench-pub1", inflight)
    done = threading.Event()
    acked = [0]

    def on_publish(*_a: Any) -> None:
        acked[0] += 1
        if acked[0] == messages:
            done.set()

    paho.on_publish = on_publish
    start = time.perf_counter()
    for _ in range(messages):
        paho.publish("bench/q1", PAYLOAD, 1)
    assert done.wait(WAIT_S), f"{acked[0]} of {messages} acknowledged"
    seconds = time.perf_counter() - start
    paho.disconnect()
    paho.loop_stop()
    return messages / seconds


def qos0_fanout(port: int, messages: int, inflight: int) -> float:
    sub = client(port, "bench-sub0", inflight)
    got = [0]
    done = threading.Event()
    subscribed = threading.Event()
    sub.on_subscribe = lambda *_a: subscribed.set()

    def on_message(*_a: Any) -> None:
        got[0] += 1
        if got[0] == messages:
            done.set()

    sub.on_message = on_message
    sub.subscribe("bench/q0", 0)
    assert subscribed.wait(30)
    pub = client(port, "bench-pub0", inflight)
    start = time.perf_counter()
    for _ in range(messages):
        pub.publish("bench/q0", PAYLOAD, 0)
    assert done.wait(WAIT_S), f"{got[0]} of {messages} received"
    seconds = time.perf_counter() - start
    for paho in (pub, sub):
        paho.disconnect()
        paho.loop_stop()
    return messages / seconds


@contextmanager
def streamq_broker(directory: Path) -> Iterator[int]:
    port = free_port()
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "streamq", "serve", "--data-dir", str(directory / "data")),
            *("--amqp-port", "0", "--http-port", "0", "--stream-port", "-1"),
            *("--mqtt-port", str(port)),
        ],
        stderr=subprocess.PIPE,
    )
    assert process.stderr is not None
    printed = b""
    while not re.search(rb"listening ", printed):
        line = process.stderr.readline()
        assert line, printed
        printed += line
    try:
        yield port
    finally:
        process.terminate()
        process.wait(30)


@contextmanager
def rabbitmq_broker(directory: Path) -> Iterator[int]:
    port = free_port()
    server = RabbitMQServer(
        directory,
        plugins=("rabbitmq_mqtt",),
        extra_config=f"mqtt.listeners.tcp.1 = 127.0.0.1:{port}\n",
    )
    try:
        deadline = time.monotonic() + 60
        while not _accepts(port):
            assert time.monotonic() < deadline, "RabbitMQ's MQTT listener did not open"
            time.sleep(0.2)
        yield port
    finally:
        server.stop()


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


Scenario = Callable[[int, int, int], float]
SCENARIOS: dict[str, Scenario] = {"qos1-publish": qos1_publish, "qos0-fanout": qos0_fanout}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--inflight", type=int, default=100)
    args = parser.parse_args(argv)
    print(f"cpu: {cpu_model()}, {os.cpu_count()} cores; payload {len(PAYLOAD)} bytes")
    print(f"load before: {os.getloadavg()}")
    results: dict[str, dict[str, float]] = {}
    brokers = {"streamq": streamq_broker, "rabbitmq": rabbitmq_broker}
    for name, start in brokers.items():
        with tempfile.TemporaryDirectory() as directory, start(Path(directory)) as port:
            results[name] = {
                scenario: run(port, args.messages, args.inflight)
                for scenario, run in SCENARIOS.items()
            }
    for scenario in SCENARIOS:
        streamq_rate, rabbit_rate = results["streamq"][scenario], results["rabbitmq"][scenario]
        print(
            f"{scenario:14} streamq {streamq_rate:9.0f} msg/s   rabbitmq {rabbit_rate:9.0f} "
            f"msg/s   ratio {streamq_rate / rabbit_rate:.2f}"
        )
    print(f"load after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
