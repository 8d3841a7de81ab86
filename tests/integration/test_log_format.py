"""`--log-format json` and progress lines, as a user runs `streamq serve`: a real process
whose stderr is read whole, real pika clients, a real data directory damaged on disk."""

from __future__ import annotations

import asyncio
import glob
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest
import rstream

from tests.integration.broker_process import STARTUP_TIMEOUT_S, BrokerProcess, streamq

REQUIRED_KEYS = ("time", "level", "logger", "message")
TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
STREAM_SEGMENT_BYTES = 4096  # the smallest segment a stream takes (streams.SEGMENT_BYTES_MIN)
STREAM_MESSAGES = 240  # of 1 KiB: about 60 segments of 4 KiB
SEGMENTS_MIN = 50
LISTENING_PORT = re.compile(rb"listening amqp=127\.0\.0\.1:(\d+)")


def connect(port: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", port, socket_timeout=5, blocked_connection_timeout=5)
    )


def json_lines(stderr: bytes) -> list[dict[str, object]]:
    """Every line of `stderr` as an object; fails on any line that is not one."""
    parsed = []
    for line in stderr.decode().splitlines():
        assert line.strip(), "an empty line on stderr"
        value = json.loads(line)  # raises on a line that is not JSON
        assert isinstance(value, dict), line
        assert all(key in value for key in REQUIRED_KEYS), line
        assert TIME.match(str(value["time"])), line
        assert value["level"] in ("debug", "info", "warning", "error", "critical"), line
        parsed.append(value)
    return parsed


class Brokers:
    """Starts brokers on one data directory; each one still running at the end is killed."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.started: list[BrokerProcess] = []

    def start(self, *options: str) -> BrokerProcess:
        broker = BrokerProcess(self.data_dir, *options)
        self.started.append(broker)
        return broker


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[Brokers]:
    made = Brokers(tmp_path / "data")
    yield made
    for broker in made.started:
        if broker.process.poll() is None:
            broker.process.kill()
            broker.process.wait(timeout=STARTUP_TIMEOUT_S)


def test_every_line_is_json_and_a_connection_carries_its_fields(brokers: Brokers) -> None:
    """A pika connection opens and closes: both lines name it as the management API does,
    with its user and vhost; every line of the whole run parses with the four keys."""
    broker = brokers.start("--log-format", "json")
    connection = connect(broker.amqp_port)
    client_port = connection._impl._transport._sock.getsockname()[1]
    connection.channel().queue_declare("logged", durable=True)
    connection.close()
    assert broker.stop() == 0
    lines = json_lines(broker.stderr)
    name = f"127.0.0.1:{client_port} -> 127.0.0.1:{broker.amqp_port}"
    opened = [line for line in lines if line.get("connection") == name]
    assert [str(line["message"]).split(" ")[:2] for line in opened] == [
        ["accepted", "AMQP"],
        ["closed", "AMQP"],
    ], opened
    for line in opened:
        assert (line["level"], line["user"], line["vhost"]) == ("info", "guest", "/")
        assert line["logger"].startswith("amqp_gateway.")  # type: ignore[attr-defined]  # a str
    assert any(line["message"] == "vhost /: started" and line["vhost"] == "/" for line in lines)
    assert any(str(line["message"]).startswith("listening amqp=") for line in lines)


def test_a_failed_queue_line_carries_the_exception(brokers: Brokers) -> None:
    """A durable queue's journal is damaged on disk while the broker is stopped: the next
    start logs the queue not restored, with the queue and vhost fields and the exception
    (type, message, traceback)."""
    broker = brokers.start("--log-format", "json")
    connection = connect(broker.amqp_port)
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("damaged", durable=True)
    channel.basic_publish("", "damaged", b"body", pika.BasicProperties(delivery_mode=2))
    connection.close()
    assert broker.stop() == 0
    (journal,) = glob.glob(str(brokers.data_dir / "vhosts" / "*" / "queues" / "*.journal"))
    with open(journal, "r+b") as file:
        file.write(b"\xde\xad\xbe\xef" * 4)
    broker = brokers.start("--log-format", "json")
    assert broker.stop() == 0
    failed = [line for line in json_lines(broker.stderr) if line.get("queue") == "damaged"]
    assert len(failed) == 1, failed
    (line,) = failed
    assert (line["level"], line["vhost"]) == ("error", "/")
    exception = line["exception"]
    assert isinstance(exception, dict)
    assert exception["type"] == "JournalCorrupted"
    assert "bad header" in exception["message"]
    assert exception["traceback"].startswith("Traceback (most recent call last):")
    assert "JournalCorrupted" in exception["traceback"]


def test_text_stays_the_default(brokers: Brokers) -> None:
    broker = brokers.start()
    assert broker.stop() == 0
    for line in broker.stderr.decode().splitlines():
        assert re.match(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ \S+: ", line), line


def test_recovery_of_many_segments_logs_progress(brokers: Brokers) -> None:
    """A stream of about 60 small segments: the next start, with a progress interval of 0
    (a line per segment), logs the stream log's recovery with rising counts of its total,
    then a last line at info."""
    broker = brokers.start()
    connection = connect(broker.amqp_port)
    channel = connection.channel()
    channel.confirm_delivery()
    arguments = {"x-queue-type": "stream", "x-stream-max-segment-size-bytes": STREAM_SEGMENT_BYTES}
    channel.queue_declare("big", durable=True, arguments=arguments)
    for _ in range(STREAM_MESSAGES):
        channel.basic_publish("", "big", b"x" * 1024)
    connection.close()
    assert broker.stop() == 0
    streams = glob.glob(str(brokers.data_dir / "vhosts" / "*" / "streams" / "*"))
    (stream_dir,) = [path for path in streams if os.path.isdir(path)]
    segments = len([name for name in os.listdir(stream_dir) if name.endswith(".seg")])
    assert segments >= SEGMENTS_MIN, os.listdir(stream_dir)

    config = brokers.data_dir.parent / "streamq.ini"
    config.write_text("[main]\nlog_progress_interval = 0\n")
    broker = brokers.start("--log-format", "json", "--config", str(config))
    assert broker.stop() == 0
    prefix = f"log {stream_dir}: recovery: "
    lines = json_lines(broker.stderr)
    mine = [line for line in lines if str(line["message"]).startswith(prefix)]
    *steps, last = mine
    numbers = [line["progress"] for line in steps]
    assert [n["done"] for n in numbers] == list(range(1, segments + 1)), mine  # type: ignore[index]
    assert {n["total"] for n in numbers} == {segments}  # type: ignore[index]
    middle = str(steps[segments // 2]["message"]).removeprefix(prefix)
    assert re.fullmatch(
        rf"{segments // 2 + 1} of {segments} segments \(\d+%\)(, .*/s, ETA \w+)?", middle
    )
    assert re.fullmatch(
        rf"{segments} of {segments} segments done in \w+", str(last["message"]).removeprefix(prefix)
    )
    assert last["level"] == "info"
    # A level up: the vhost's streams opened of its total, with the vhost field.
    opening = [line for line in lines if str(line["message"]).startswith("vhost /: opening")]
    step, done = (str(line["message"]) for line in opening)
    assert step.startswith("vhost /: opening streams: 1 of 1 streams (100%)")
    assert re.fullmatch(r"vhost /: opening streams: 1 of 1 streams done in \w+", done)
    assert all(line["vhost"] == "/" for line in opening)


def run_with_journal_stream(data_dir: Path, journal: str, *options: str) -> list[str]:
    """`streamq serve` with stderr on a pipe and JOURNAL_STREAM set to `journal` ("match":
    that pipe's "DEVICE:INODE", as systemd sets it); a refused login makes a warning. The
    lines it wrote, once stopped."""
    read_fd, write_fd = os.pipe()
    info = os.fstat(write_fd)
    value = f"{info.st_dev}:{info.st_ino}" if journal == "match" else journal
    args = ("--data-dir", str(data_dir), "--amqp-port", "0", "--http-port", "0")
    process = subprocess.Popen(
        streamq("serve", *args, "--stream-port", "-1", "--mqtt-port", "-1", *options),
        stderr=write_fd,
        env={**os.environ, "JOURNAL_STREAM": value},
    )
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as stderr:
        try:
            printed = b""
            while (found := LISTENING_PORT.search(printed)) is None:
                line = stderr.readline()
                assert line, f"broker exited: {printed!r}"
                printed += line
            refused = pika.ConnectionParameters(
                "127.0.0.1", int(found[1]), credentials=pika.PlainCredentials("guest", "wrong")
            )
            with pytest.raises(pika.exceptions.ProbableAuthenticationError):
                pika.BlockingConnection(refused)
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=STARTUP_TIMEOUT_S) == 0
            printed += stderr.read()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=STARTUP_TIMEOUT_S)
    return printed.decode().splitlines()


def test_journald_priorities_when_stderr_is_the_journal(tmp_path: Path) -> None:
    """As LavinMQ: when JOURNAL_STREAM names stderr, every line starts with its syslog
    priority and the text lines have no time (journald adds its own)."""
    lines = run_with_journal_stream(tmp_path / "data", "match")
    text_line = re.compile(r"^<(\d)>(DEBUG|INFO|WARNING|ERROR|CRITICAL) \S+: ")
    priorities = {"INFO": "6", "WARNING": "4", "ERROR": "3", "CRITICAL": "2", "DEBUG": "7"}
    for line in lines:
        match = text_line.match(line)
        assert match is not None, line
        assert match[1] == priorities[match[2]], line
    assert any(line.startswith("<6>INFO streamq: listening amqp=") for line in lines)
    assert any(line.startswith("<4>WARNING amqp_gateway.access: login refused") for line in lines)


def test_journald_priorities_prefix_json_lines(tmp_path: Path) -> None:
    lines = run_with_journal_stream(tmp_path / "data", "match", "--log-format", "json")
    assert lines and all(re.match(r"^<[2-7]>\{", line) for line in lines), lines
    objects = json_lines("\n".join(line[3:] for line in lines).encode())
    warning = next(o for o in objects if str(o["message"]).startswith("login refused"))
    assert warning["level"] == "warning" and warning["user"] == "guest"


def test_another_journal_stream_leaves_lines_plain(tmp_path: Path) -> None:
    """A JOURNAL_STREAM inherited from a parent whose stderr was the journal, while this
    process's stderr is a pipe: no prefixes, the time stays."""
    lines = run_with_journal_stream(tmp_path / "data", "1:1")
    assert lines and all(re.match(r"^\d{4}-\d\d-\d\d ", line) for line in lines), lines


def test_definitions_import_at_boot_logs_progress(brokers: Brokers) -> None:
    """`load_definitions` with 20 queues, 5 exchanges and 5 bindings, a progress line per
    item: the counts rise to the document's total, then a last line."""
    queues = [{"name": f"q{i}", "vhost": "/", "durable": True} for i in range(20)]
    exchanges = [{"name": f"x{i}", "vhost": "/", "type": "fanout"} for i in range(5)]
    bindings = [
        {"source": f"x{i}", "vhost": "/", "destination": f"q{i}", "destination_type": "queue"}
        for i in range(5)
    ]
    document = {"vhosts": [{"name": "/"}], "queues": queues, "exchanges": exchanges}
    document["bindings"] = bindings
    definitions = brokers.data_dir.parent / "definitions.json"
    definitions.write_text(json.dumps(document))
    config = brokers.data_dir.parent / "streamq.ini"
    config.write_text(f"[main]\nlog_progress_interval = 0\nload_definitions = {definitions}\n")
    broker = brokers.start("--log-format", "json", "--config", str(config))
    assert broker.stop() == 0
    prefix = "definitions import: "
    mine = [line for line in json_lines(broker.stderr) if str(line["message"]).startswith(prefix)]
    *steps, last = mine
    total = 1 + 20 + 5 + 5
    assert [line["progress"]["done"] for line in steps] == list(range(1, total + 1))  # type: ignore[index]
    assert str(steps[-1]["message"]).startswith(f"{prefix}{total} of {total} items (100%)")
    assert re.fullmatch(rf"{prefix}{total} of {total} items done in \w+", str(last["message"]))


def test_an_error_that_stops_serve_is_a_json_line(brokers: Brokers, tmp_path: Path) -> None:
    """A second broker on a port in use stops with exit status 1: in the JSON format its
    error is a critical line too, so that stderr stays a stream of objects."""
    running = brokers.start()
    result = subprocess.run(
        streamq(
            *("serve", "--data-dir", str(tmp_path / "other"), "--log-format", "json"),
            *("--amqp-port", str(running.amqp_port), "--stream-port", "-1", "--mqtt-port", "-1"),
        ),
        capture_output=True,
        timeout=STARTUP_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 1
    *_, last = json_lines(result.stderr)
    assert last["level"] == "critical"
    assert f"cannot listen for AMQP on 127.0.0.1:{running.amqp_port}" in str(last["message"])


def test_uncaught_errors_and_warnings_are_json_lines() -> None:
    """In the JSON format, what Python itself would print on stderr (a warning, an
    uncaught exception in a thread and in the main thread) comes as objects."""
    program = (
        "import threading, warnings\n"
        "from streamq import log_output\n"
        "log_output.configure('info', '', 'json')\n"
        "warnings.warn('careful')\n"
        "thread = threading.Thread(target=lambda: 1 / 0, name='worker')\n"
        "thread.start(); thread.join()\n"
        "raise ValueError('the end')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, timeout=30, check=False
    )
    assert result.returncode == 1
    warning, in_thread, uncaught = json_lines(result.stderr)
    assert warning["level"] == "warning" and "careful" in str(warning["message"])
    assert in_thread["message"] == "uncaught exception in thread worker"
    assert in_thread["exception"]["type"] == "ZeroDivisionError"  # type: ignore[index]
    assert uncaught["level"] == "critical"
    assert uncaught["exception"]["type"] == "ValueError"  # type: ignore[index]
    assert "line 7, in <module>" in uncaught["exception"]["traceback"]  # type: ignore[index]


def test_log_file_takes_the_format_and_no_journal_prefix(tmp_path: Path) -> None:
    """`log_file` with `log_format = json`: objects in the file; no priority prefix, even
    with JOURNAL_STREAM naming that very file (the journal reads stderr, not a file)."""
    path = tmp_path / "streamq.log"
    path.touch()
    info = os.stat(path)
    program = (
        "import logging, sys\n"
        "from streamq import log_output\n"
        "log_output.configure('info', sys.argv[1], 'json')\n"
        "logging.getLogger('streamq.x').info('to the file', extra={'vhost': 'v'})\n"
    )
    subprocess.run(
        [sys.executable, "-c", program, str(path)],
        env={**os.environ, "JOURNAL_STREAM": f"{info.st_dev}:{info.st_ino}"},
        timeout=30,
        check=True,
    )
    (line,) = json_lines(path.read_bytes())
    assert (line["logger"], line["message"], line["vhost"]) == ("streamq.x", "to the file", "v")


def test_a_stream_protocol_connection_carries_its_fields(brokers: Brokers) -> None:
    """rstream connects on the stream port and leaves: accepted and closed lines with the
    connection, user and vhost fields, as the AMQP ones."""
    broker = brokers.start("--log-format", "json")
    found = re.search(rb"stream=127\.0\.0\.1:(\d+)", broker.stderr)
    assert found is not None
    port = int(found[1])

    async def connect_and_leave() -> None:
        async with rstream.Producer("127.0.0.1", port, username="guest", password="guest"):
            pass

    asyncio.run(asyncio.wait_for(connect_and_leave(), STARTUP_TIMEOUT_S))
    assert broker.stop() == 0
    lines = json_lines(broker.stderr)
    stream_lines = [
        line for line in lines if str(line.get("connection", "")).endswith(f"127.0.0.1:{port}")
    ]
    assert [str(line["message"]).split(" ")[:2] for line in stream_lines] == [
        ["accepted", "stream"],
        ["closed", "stream"],
    ], stream_lines
    assert all((line["user"], line["vhost"]) == ("guest", "/") for line in stream_lines)
