"""Queue depth on one broker this script starts itself: memory with N messages queued,
memory once they are gone, and a restart after SIGKILL with N queued (issue 19).

Usage: python benchmarks/depth.py streamq|lavinmq|rabbitmq [--messages N] [--idle-s S]
           [--lavinmq PATH] [--dir DIR] [--json FILE] [--streamq COMMAND]

Steps, on one broker with a fresh data directory, all messages 16 B, persistent, published
by `streamq perf` with confirms (so 'confirmed' means the broker said they were safe):
1. N messages into one durable queue; the broker's VmRSS once steady;
2. that queue consumed (no-ack) and deleted; VmRSS after `--idle-s` seconds idle;
3. N messages into ten durable queues of N/10; VmRSS once steady;
4. SIGKILL, start again on the same directory: seconds from the process start to the AMQP
   port accepting a connection, and to every queue answering a passive queue.declare,
   whose message counts must hold every confirmed message; VmRSS once steady;
5. the ten queues deleted; VmRSS after `--idle-s` seconds idle.

streamq runs as `streamq serve`, LavinMQ from `--lavinmq` (a v1.1.5 build; it binds its
ctl socket /tmp/lavinmqctl.sock, shared with any other LavinMQ on the machine), RabbitMQ
as Debian's rabbitmq-server through tests/differential/peers.py. Every broker listens on
free loopback ports and is stopped by its own pid. Prints a table, and with --json the
values and the environment.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Final, Protocol

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pika.exceptions

from benchmarks.admin import delete_all, queue_depth, server_version
from benchmarks.machine import cpu_model
from benchmarks.perf_process import ScenarioError, default_streamq, run_perf
from benchmarks.rss import read_status_kib, wait_for_steady_rss
from tests.differential.peers import RabbitMQServer, free_port

MESSAGES: Final = 1_000_000
QUEUES: Final = 10
IDLE_S: Final = 60.0
BODY_BYTES: Final = 16
CONFIRM_WINDOW: Final = 1000
FILL_RATE_MIN: Final = 5_000
"""Slowest fill or drain (msgs/s) a timeout allows."""
MARGIN_S: Final = 60.0
START_TIMEOUT_S: Final = 600.0
"""How long a restart may take to accept and answer: recovering 10M messages is slow."""
POLL_S: Final = 0.05
STOP_TIMEOUT_S: Final = 30.0
DEFAULT_LAVINMQ: Final = "/work/lavinmq/src/bin/lavinmq"
_KIB: Final = 1024


class Broker(Protocol):
    name: str
    pid: int
    amqp_port: int

    def start(self) -> float:
        """Start the process; return the monotonic time just before it was started."""
        ...

    def kill(self) -> None: ...

    def stop(self) -> None: ...


class CommandBroker:
    """A broker that is one process we start: streamq or LavinMQ, on fixed free ports so
    a restart can be watched from its first instant."""

    def __init__(self, name: str, command: list[str], amqp_port: int, log: Path) -> None:
        self.name, self.command, self.amqp_port, self.log = name, command, amqp_port, log
        self.process: subprocess.Popen[bytes] | None = None
        self.pid = 0

    def start(self) -> float:
        started = time.monotonic()
        with self.log.open("ab") as output:
            self.process = subprocess.Popen(self.command, stdout=output, stderr=output)
        self.pid = self.process.pid
        return started

    def kill(self) -> None:
        assert self.process is not None, "not started"
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(STOP_TIMEOUT_S)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(STOP_TIMEOUT_S)


def streamq_broker(streamq: str, directory: Path) -> CommandBroker:
    amqp_port, http_port = free_port(), free_port()
    command = [streamq, "serve", "--data-dir", str(directory / "data")]
    command += ["--amqp-port", str(amqp_port), "--http-port", str(http_port)]
    command += ["--stream-port", "-1"]
    return CommandBroker("streamq", command, amqp_port, directory / "broker.log")


def lavinmq_broker(binary: str, directory: Path) -> CommandBroker:
    amqp_port, http_port = free_port(), free_port()
    command = [binary, "-D", str(directory / "data"), "-b", "127.0.0.1"]
    command += ["-p", str(amqp_port), "--http-port", str(http_port)]
    return CommandBroker("LavinMQ", command, amqp_port, directory / "broker.log")


class RabbitBroker:
    """Debian's RabbitMQ through the differential tests' `RabbitMQServer`, whose start
    returns once the management API answers (and picks new ports): its 'accepting' time
    is an upper bound, from the process start to the management API and then the AMQP
    port answering."""

    name = "RabbitMQ"

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.server: RabbitMQServer | None = None
        self.pid = 0
        self.amqp_port = 0

    def start(self) -> float:
        started = time.monotonic()
        self.server = RabbitMQServer(self.directory)  # returns once the HTTP API answers
        self.amqp_port = self.server.amqp_port
        beam = self.server._beam_pid()  # the Erlang VM, whose memory is the broker's
        assert beam is not None, "RabbitMQ wrote no pid file"
        self.pid = beam
        return started

    def kill(self) -> None:
        assert self.server is not None, "not started"
        os.kill(self.pid, signal.SIGKILL)
        self.server.process.wait(STOP_TIMEOUT_S)
        self.server.stop()  # stops our epmd; the VM is gone already

    def stop(self) -> None:
        if self.server is not None and self.server.process.poll() is None:
            self.server.stop()


def url(broker: Broker) -> str:
    return f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}/%2f"


def seconds_until_accepting(broker: Broker, started: float) -> float:
    """Seconds from `started` until the AMQP port accepts a TCP connection."""
    deadline = started + START_TIMEOUT_S
    while True:
        with (
            contextlib.suppress(OSError),
            socket.create_connection(("127.0.0.1", broker.amqp_port), timeout=1.0),
        ):
            return time.monotonic() - started
        if time.monotonic() > deadline:
            raise ScenarioError(f"{broker.name} did not accept in {START_TIMEOUT_S:.0f} s")
        time.sleep(POLL_S)


def depths_when_ready(broker: Broker, queues: list[str], started: float) -> tuple[float, int]:
    """Seconds from `started` until every queue answers a passive declare, and the sum
    of their message counts then."""
    deadline = started + START_TIMEOUT_S
    found: dict[str, int] = {}
    while len(found) < len(queues):
        for queue in queues:
            if queue not in found:
                with contextlib.suppress(ScenarioError, pika.exceptions.AMQPError):
                    found[queue] = queue_depth(url(broker), queue)
        if time.monotonic() > deadline:
            raise ScenarioError(f"{broker.name}: queues not back in {START_TIMEOUT_S:.0f} s")
        if len(found) < len(queues):
            time.sleep(POLL_S)
    return time.monotonic() - started, sum(found.values())


def fill(streamq: str, broker: Broker, queue: str, count: int) -> int:
    """Publish `count` persistent 16 B messages with confirms; return those confirmed."""
    args = ["throughput", "--uri", url(broker), "-u", queue, "-x", "1", "-y", "0", "-p"]
    args += ["-s", str(BODY_BYTES), "-c", str(CONFIRM_WINDOW), "-C", str(count), "-q"]
    summary = run_perf(streamq, args, count / FILL_RATE_MIN + MARGIN_S)
    confirmed = summary.get("confirmed")
    if not isinstance(confirmed, int):
        raise ScenarioError(f"no confirmed count from streamq perf: {summary}")
    return confirmed


def drain(streamq: str, broker: Broker, queue: str, count: int) -> None:
    args = ["throughput", "--uri", url(broker), "-u", queue, "-x", "0", "-y", "1"]
    args += ["-D", str(count), "-q"]
    run_perf(streamq, args, count / FILL_RATE_MIN + MARGIN_S)


def steady_rss_mib(broker: Broker) -> float | None:
    wait_for_steady_rss(broker.pid)
    rss_kib = read_status_kib(broker.pid, "VmRSS")
    return None if rss_kib is None else rss_kib / _KIB


def idle_rss_mib(broker: Broker, idle_s: float) -> float | None:
    time.sleep(idle_s)
    rss_kib = read_status_kib(broker.pid, "VmRSS")
    return None if rss_kib is None else rss_kib / _KIB


def clean(broker: Broker, queues: list[str]) -> None:
    for failure in delete_all(url(broker), queues):
        print(f"warning: {broker.name}: {failure}", file=sys.stderr)


def measure(broker: Broker, streamq: str, messages: int, idle_s: float) -> dict[str, object]:
    """Steps 1-5 of the module docstring; the broker is started here and left running."""
    result: dict[str, object] = {"broker": broker.name, "messages": messages}
    started = broker.start()
    result["start_accept_s"] = seconds_until_accepting(broker, started)
    result["server"] = server_version(url(broker))
    result["rss_empty_mib"] = steady_rss_mib(broker)
    progress(broker, result)
    result["confirmed_one_queue"] = fill(streamq, broker, "depth-one", messages)
    result["rss_one_queue_mib"] = steady_rss_mib(broker)
    progress(broker, result)
    drain(streamq, broker, "depth-one", messages)
    clean(broker, ["depth-one"])
    result["rss_idle_after_consume_mib"] = idle_rss_mib(broker, idle_s)
    progress(broker, result)
    queues = [f"depth-ten-{index}" for index in range(QUEUES)]
    shares = [messages // QUEUES + (index < messages % QUEUES) for index in range(QUEUES)]
    confirmed = sum(fill(streamq, broker, q, n) for q, n in zip(queues, shares, strict=True))
    result["confirmed_ten_queues"] = confirmed
    result["rss_ten_queues_mib"] = steady_rss_mib(broker)
    progress(broker, result)
    broker.kill()
    started = broker.start()
    result["restart_accept_s"] = seconds_until_accepting(broker, started)
    result["restart_queues_s"], found = depths_when_ready(broker, queues, started)
    result["found_after_restart"] = found
    result["missing_after_restart"] = max(0, confirmed - found)
    result["rss_after_restart_mib"] = steady_rss_mib(broker)
    progress(broker, result)
    clean(broker, queues)
    result["rss_idle_after_delete_mib"] = idle_rss_mib(broker, idle_s)
    return result


def progress(broker: Broker, result: dict[str, object]) -> None:
    key = list(result)[-1]
    print(f"{broker.name}: {key} = {result[key]}", file=sys.stderr, flush=True)


_ROWS: Final = (
    ("start_accept_s", "fresh start: AMQP port accepting", "s"),
    ("rss_empty_mib", "RSS, empty", "MiB"),
    ("confirmed_one_queue", "confirmed into one queue", ""),
    ("rss_one_queue_mib", "RSS, N queued in one queue", "MiB"),
    ("rss_idle_after_consume_mib", "RSS, idle after consuming it", "MiB"),
    ("confirmed_ten_queues", "confirmed into ten queues of N/10", ""),
    ("rss_ten_queues_mib", "RSS, N queued in ten queues", "MiB"),
    ("restart_accept_s", "after SIGKILL: AMQP port accepting", "s"),
    ("restart_queues_s", "after SIGKILL: all queues answer", "s"),
    ("found_after_restart", "messages found after restart", ""),
    ("missing_after_restart", "confirmed messages missing", ""),
    ("rss_after_restart_mib", "RSS after restart, N queued", "MiB"),
    ("rss_idle_after_delete_mib", "RSS, idle after deleting them", "MiB"),
)


def table(result: dict[str, object]) -> str:
    lines = [f"| {result['broker']}, N = {result['messages']:,} | value |", "|---|---|"]
    for key, label, unit in _ROWS:
        value = result.get(key)
        if isinstance(value, float):
            text = f"{value:,.1f} {unit}" if unit == "MiB" else f"{value:.2f} {unit}"
        else:
            text = "n/a" if value is None else f"{value:,}" if isinstance(value, int) else value
        lines.append(f"| {label} | {text} |")
    return "\n".join(lines)


def environment(directory: Path) -> dict[str, object]:
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "kernel": platform.release(),
        "load_average": os.getloadavg(),
        "data_dir": str(directory),
        "body_bytes": BODY_BYTES,
        "delivery_mode": 2,
        "confirm_window": CONFIRM_WINDOW,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("broker", choices=("streamq", "lavinmq", "rabbitmq"))
    parser.add_argument("--messages", type=int, default=MESSAGES, help="N (1,000,000)")
    parser.add_argument("--idle-s", type=float, default=IDLE_S, help="idle wait (60 s)")
    parser.add_argument("--lavinmq", default=DEFAULT_LAVINMQ, help="the lavinmq binary")
    parser.add_argument("--dir", type=Path, help="work directory (a new temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--json", type=Path, help="also write the values to this file")
    parser.add_argument("--streamq", default=default_streamq(), help="the streamq command")
    args = parser.parse_args(argv)
    if args.messages < QUEUES:
        parser.error(f"--messages must be at least {QUEUES}")
    return args


def make_broker(args: argparse.Namespace, directory: Path) -> Broker:
    if args.broker == "streamq":
        return streamq_broker(args.streamq, directory)
    if args.broker == "lavinmq":
        return lavinmq_broker(args.lavinmq, directory)
    return RabbitBroker(directory)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    directory = args.dir or Path(tempfile.mkdtemp(prefix="streamq-depth-"))
    directory.mkdir(parents=True, exist_ok=True)
    broker = make_broker(args, directory)
    env = environment(directory)
    try:
        result = measure(broker, args.streamq, args.messages, args.idle_s)
    except ScenarioError as exc:
        print(f"depth: {broker.name}: {exc}", file=sys.stderr)
        return 1
    finally:
        broker.stop()
        if not args.keep:
            shutil.rmtree(directory, ignore_errors=True)
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps({"environment": env, "result": result}, indent=2) + "\n")
    return 0 if result["missing_after_restart"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
