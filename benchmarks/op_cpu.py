"""Broker CPU per AMQP operation: the small exchanges a Celery task is made of.

Usage: python benchmarks/op_cpu.py PORT:PID [PORT:PID ...] [--ops N]

For each broker (its AMQP port on 127.0.0.1 and the pid whose CPU time is read from
/proc, every thread counted), one py-amqp connection as guest runs, one after the other:
N redeclares of an existing auto-delete queue with `x-expires` (what kombu sends before
every Celery task, for the `rpc://` reply queue), N persistent publishes of a Celery-sized
task message to it (then one declare as a barrier), and N deliveries of them to a
consumer with prefetch 8 that acks each with its own basic.ack. It prints the broker's
CPU microseconds per operation (utime + stime, clock ticks) and the client's wall-clock
microseconds per operation. The broker's CPU per operation does not depend much on
other load on the machine; the wall-clock figures do (a woken process waits for a core).
"""

from __future__ import annotations

import argparse
import os
import time

import amqp  # py-amqp, Celery's and kombu's client

DEFAULT_OPS = 20_000
PREFETCH = 8
BODY = b'{"args": [1, 2], "kwargs": {}}' * 4
HEADERS = {
    "lang": "py", "task": "add", "id": "x" * 36, "retries": 0, "eta": None, "root_id": "x" * 36,
    "parent_id": None, "argsrepr": "(1, 2)", "kwargsrepr": "{}", "origin": "gen1@host",
}  # fmt: skip


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(port: int, pid: int, ops: int) -> dict[str, tuple[float, float]]:
    """Per phase: (broker CPU µs per op, client wall µs per op)."""
    connection = amqp.Connection(f"127.0.0.1:{port}", userid="guest", password="guest")
    connection.connect()
    channel = connection.channel()
    queue = f"op-cpu-{time.time_ns()}"
    arguments = {"x-expires": 86_400_000}

    def declare() -> None:
        channel.queue_declare(queue, durable=False, auto_delete=True, arguments=arguments)

    def publish() -> None:
        message = amqp.Message(
            BODY, delivery_mode=2, content_type="application/json", content_encoding="utf-8",
            correlation_id="c" * 36, reply_to="r" * 36, application_headers=HEADERS,
        )  # fmt: skip
        channel.basic_publish(message, "", queue)

    declare()
    results: dict[str, tuple[float, float]] = {}
    for name, step in (("declare", declare), ("publish", publish)):
        cpu, wall = cpu_s(pid), time.perf_counter()
        for _ in range(ops):
            step()
        declare()  # a round trip: the publishes are in
        results[name] = (
            (cpu_s(pid) - cpu) / ops * 1e6,
            (time.perf_counter() - wall) / ops * 1e6,
        )
    received = [0]

    def on_message(message: amqp.Message) -> None:
        received[0] += 1
        channel.basic_ack(message.delivery_tag)

    channel.basic_qos(0, PREFETCH, False)
    cpu, wall = cpu_s(pid), time.perf_counter()
    tag = channel.basic_consume(queue, callback=on_message)
    while received[0] < ops:
        connection.drain_events(timeout=30)
    results["deliver+ack"] = (
        (cpu_s(pid) - cpu) / ops * 1e6,
        (time.perf_counter() - wall) / ops * 1e6,
    )
    channel.basic_cancel(tag)
    connection.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("brokers", nargs="+", help="PORT:PID of each broker")
    parser.add_argument("--ops", type=int, default=DEFAULT_OPS)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}; broker CPU µs per op (client wall µs)")
    for broker in args.brokers:
        port, pid = (int(part) for part in broker.split(":"))
        row = measure(port, pid, args.ops)
        cells = ", ".join(f"{name} {cpu:.1f} ({wall:.0f})" for name, (cpu, wall) in row.items())
        print(f"{port}: {cells}")


if __name__ == "__main__":
    main()
