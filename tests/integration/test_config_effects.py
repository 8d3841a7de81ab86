"""Config keys whose effect no other test observed through the config file, observed here
through one `streamq serve` started with all of them (AMQP and stream tuning, the
advertised stream address, the message size limit), and the LavinMQ keys streamq refuses
to start with (streamq.config_refused). The test for every other key is named in
docs/compatibility.md ("HTTP fields and config keys")."""

from __future__ import annotations

import re
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest

from stream_gateway.codec import commands as c
from tests.integration.broker_process import (
    STARTUP_TIMEOUT_S,
    BrokerProcess,
    streamq,
    wait_listening,
)
from tests.stream.test_gateway_protocol import RawClient

TIMEOUT_S = 10
PORTS = ("--amqp-port", "0", "--http-port", "0", "--stream-port", "0", "--mqtt-port", "-1")
CONFIG = """\
[amqp]
heartbeat = 17
frame_max = 65536
channel_max = 33
max_message_size = 4096

[stream]
frame_max = 65536
heartbeat = 7
advertised_host = stream.example
advertised_port = 5999
"""


class Serve(BrokerProcess):
    """`streamq serve` with the config file only (BrokerProcess adds flags, such as
    `--stream-advertised-host`, that would beat the file's keys), on ports from the OS."""

    def __init__(self, data_dir: Path, ini: Path) -> None:
        self.data_dir = data_dir
        args = ("--data-dir", str(data_dir), "--config", str(ini), *PORTS)
        self.process = subprocess.Popen(streamq("serve", *args), stderr=subprocess.PIPE)
        self.stderr, self.amqp_port, self.http_port = wait_listening(self.process)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    directory = tmp_path_factory.mktemp("config-effects")
    ini = directory / "streamq.ini"
    ini.write_text(CONFIG)
    running = Serve(directory / "data", ini)
    yield running
    assert running.stop() == 0


def _connect(broker: BrokerProcess) -> pika.BlockingConnection:
    # pika takes the server's heartbeat, frame_max and channel_max when it asks for none.
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1", broker.amqp_port, socket_timeout=TIMEOUT_S, connection_attempts=1
        )
    )


def test_amqp_tuning_keys_are_what_connection_tune_offers(broker: BrokerProcess) -> None:
    connection = _connect(broker)
    try:
        params = connection._impl.params  # the values negotiated in connection.tune-ok
        assert (params.heartbeat, params.frame_max, params.channel_max) == (17, 65536, 33)
    finally:
        connection.close()


def test_max_message_size_refuses_a_larger_message(broker: BrokerProcess) -> None:
    connection = _connect(broker)
    try:
        channel = connection.channel()
        channel.queue_declare("sized")
        channel.basic_publish("", "sized", b"x" * 4096)
        channel.basic_publish("", "sized", b"x" * 4097)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="message size"):
            channel.queue_declare("sized", passive=True)
    finally:
        if connection.is_open:
            connection.close()


def _stream_port(broker: BrokerProcess) -> int:
    for line in broker.stderr.decode(errors="replace").splitlines():
        if "stream=127.0.0.1:" in line:
            return int(line.split("stream=127.0.0.1:", 1)[1].split()[0])
    raise AssertionError(f"no stream listener in {broker.stderr!r}")


def test_stream_keys_are_in_tune_and_open(broker: BrokerProcess) -> None:
    client = RawClient(_stream_port(broker))
    try:
        client.send(c.PeerProperties(1, {"product": "raw"}))
        client.read()
        client.send(c.SaslHandshake(2))
        client.read()
        client.send(c.SaslAuthenticate(3, "PLAIN", b"\x00guest\x00guest"))
        client.read()
        assert client.read() == c.Tune(65536, 7)
        client.send(c.Tune(65536, 7))
        client.send(c.Open(4, "/"))
        opened = client.read()
        assert isinstance(opened, c.OpenResponse)
        assert opened.properties["advertised_host"] == "stream.example"
        assert opened.properties["advertised_port"] == "5999"
    finally:
        client.sock.close()


def _refused(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=TIMEOUT_S).close()
    except ConnectionRefusedError:
        return True
    return False


def test_bind_keys_choose_the_listening_address(tmp_path: Path) -> None:
    # 127.0.0.2 is loopback too: bound there, nothing answers on 127.0.0.1.
    ini = tmp_path / "streamq.ini"
    ini.write_text("[amqp]\nbind = 127.0.0.2\n[mgmt]\nbind = 127.0.0.2\n")
    args = ("--data-dir", str(tmp_path / "data"), "--config", str(ini), *PORTS)
    process = subprocess.Popen(streamq("serve", *args), stderr=subprocess.PIPE)
    try:
        assert process.stderr is not None
        printed, deadline = b"", time.monotonic() + STARTUP_TIMEOUT_S
        pattern = re.compile(rb"listening amqp=127\.0\.0\.2:(\d+) http=127\.0\.0\.2:(\d+)")
        while (match := pattern.search(printed)) is None:
            assert time.monotonic() < deadline and process.poll() is None, printed
            printed += process.stderr.readline()
        for port in (int(match[1]), int(match[2])):
            assert not _refused("127.0.0.2", port)
            assert _refused("127.0.0.1", port)
    finally:
        process.terminate()
        assert process.wait(timeout=STARTUP_TIMEOUT_S) == 0


@pytest.mark.parametrize(
    ("ini", "reason"),
    [  # each refused key: tests/unit/test_config_refused.py
        ("[amqp]\ndefault_consumer_prefetch = 10\n", "basic.qos"),
        ("[oauth]\nissuer = https://id.example\n", "OAuth"),
    ],
)
def test_lavinmq_keys_that_matter_stop_the_start(tmp_path: Path, ini: str, reason: str) -> None:
    path = tmp_path / "lavinmq.ini"
    path.write_text(ini)
    finished = subprocess.run(
        streamq("serve", "--data-dir", str(tmp_path / "data"), "--config", str(path), *PORTS),
        capture_output=True,
        timeout=30,  # were it started, it would serve: the timeout fails the test
        check=False,
    )
    assert finished.returncode != 0
    assert reason in finished.stderr.decode(), finished.stderr
    assert not (tmp_path / "data" / "definitions").exists()  # nothing was started


def test_their_harmless_values_start_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "lavinmq.ini"
    path.write_text(
        "[main]\nset_timestamp = false\ndefault_consumer_prefetch = 65535\n"
        "[amqp]\nmax_consumers_per_channel = 0\n"
    )
    broker = BrokerProcess(tmp_path / "data", "--config", str(path))
    try:
        with socket.create_connection(("127.0.0.1", broker.amqp_port), timeout=TIMEOUT_S):
            pass
    finally:
        assert broker.stop() == 0
    assert b"ignoring 3 setting(s)" in broker.stderr, broker.stderr
