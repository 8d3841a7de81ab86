"""`streamq serve` configured as an operator does it: a config file (the shipped example, a
LavinMQ lavinmq.ini), STREAMQ_<KEY> environment variables, --print-config, a pidfile,
definitions loaded at boot and a first user other than guest. Each test starts the broker
as a real process on loopback ports chosen by the OS and talks to it with pika."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest

from streamq.broker.users import hash_password
from tests.integration.broker_process import (
    LISTENING,
    STARTUP_TIMEOUT_S,
    BrokerProcess,
    streamq,
    wait_listening,
)

REPO = Path(__file__).resolve().parents[2]
DEFINITIONS = REPO / "tests" / "data" / "rabbitmq-3.10-definitions.json"
TIMEOUT_S = 10
# A lavinmq.ini as LavinMQ ships it (extras/lavinmq.ini) plus keys streamq does not have.
LAVINMQ_INI = """\
[main]
data_dir = /var/lib/lavinmq
guest_only_loopback = true
log_level = info
;log_file = /var/log/lavinmq.log
socket_buffer_size = 16384
tcp_nodelay = false
segment_size = 8388608
;tls_cert = /etc/lavinmq/cert.pem
;tls_key = /etc/lavinmq/key.pem
tls_min_version = 1.2
tcp_keepalive = 60:10:3
default_consumer_prefetch = 65535

[mgmt]
bind = 0.0.0.0
port = 15672
tls_port = 15671
unix_path = /tmp/lavinmq-http.sock

[amqp]
bind = 0.0.0.0
port = 5672
tcp_proxy_protocol = false
tls_port = 5671
unix_path = /tmp/lavinmq.sock
unix_proxy_protocol = false
heartbeat = 300
frame_max = 131072
channel_max = 2048
max_message_size = 134217728

[mqtt]
bind = 127.0.0.1
port = 1883

[clustering]
enabled = false
"""
# What overrides the parts of a file that a test must not use: the data directory and
# the ports (BrokerProcess gives them), loopback only, no unix socket in /tmp. Its TLS
# ports stay: without tls_cert they are off, as in LavinMQ.
OVERRIDES = ("--bind", "127.0.0.1", "--amqp-unix-path=")


class Serve:
    """`streamq serve ARGS` with exactly the environment `env`; waits until it listens."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            streamq("serve", *args), stderr=subprocess.PIPE, env=_base_env() | env
        )
        self.stderr, self.amqp_port, self.http_port = wait_listening(self.process)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=STARTUP_TIMEOUT_S)
        assert self.process.stderr is not None
        self.stderr += self.process.stderr.read()
        return code


def _base_env() -> dict[str, str]:
    # The test process's environment without STREAMQ_ variables of its own: each test
    # states the ones it means; the stream listener takes a port from the OS, never 5552.
    base = {k: v for k, v in os.environ.items() if not k.startswith("STREAMQ_")}
    return base | {"STREAMQ_STREAM_PORT": "0", "STREAMQ_MQTT_PORT": "-1"}


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        streamq(*args), capture_output=True, timeout=30, check=False, env=_base_env() | (env or {})
    )


@pytest.fixture
def started() -> Iterator[list[Serve | BrokerProcess]]:
    """Brokers a test starts; any still running at the end is killed, by its pid."""
    brokers: list[Serve | BrokerProcess] = []
    yield brokers
    for broker in brokers:
        if broker.process.poll() is None:
            broker.process.kill()
            broker.process.wait(timeout=STARTUP_TIMEOUT_S)


def connect(port: int, user: str, password: str, vhost: str = "/") -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1",
            port,
            vhost,
            pika.PlainCredentials(user, password),
            socket_timeout=TIMEOUT_S,
            blocked_connection_timeout=TIMEOUT_S,
            connection_attempts=1,
        )
    )


def round_trip(port: int, user: str = "guest", password: str = "guest") -> None:
    with connect(port, user, password) as connection:
        channel = connection.channel()
        channel.queue_declare("config-test")
        channel.basic_publish("", "config-test", b"hello")
        method, _, body = channel.basic_get("config-test", auto_ack=True)
        assert method is not None and body == b"hello"


def test_the_example_streamq_ini_starts_the_broker(
    tmp_path: Path, started: list[Serve | BrokerProcess]
) -> None:
    broker = BrokerProcess(tmp_path / "data", "--config", str(REPO / "streamq.ini"))
    started.append(broker)
    round_trip(broker.amqp_port)
    assert broker.stop() == 0
    assert b"WARNING" not in broker.stderr  # every key of the example is one streamq reads


def test_a_lavinmq_ini_starts_the_broker_with_one_warning(
    tmp_path: Path, started: list[Serve | BrokerProcess]
) -> None:
    ini = tmp_path / "lavinmq.ini"
    ini.write_text(LAVINMQ_INI)
    broker = BrokerProcess(tmp_path / "data", "--config", str(ini), *OVERRIDES)
    started.append(broker)
    round_trip(broker.amqp_port)
    assert broker.stop() == 0
    warnings = [line for line in broker.stderr.splitlines() if b" WARNING " in line]
    assert len(warnings) == 1, broker.stderr
    assert (
        warnings[0]
        .decode()
        .endswith(
            f"config file {ini}: ignoring 8 setting(s) streamq does not support: "
            "[main] socket_buffer_size (line 6); [main] tcp_nodelay (line 7); "
            "[main] segment_size (line 8); [main] tcp_keepalive (line 12); "
            "[main] default_consumer_prefetch (line 13); [mgmt] unix_path (line 19); "
            "[amqp] tls_port = 5671 (line 25; no tls_cert: the listener is off, as in LavinMQ); "
            "[mgmt] tls_port = 15671 (line 18; no tls_cert: the listener is off, as in LavinMQ)"
        )
    ), warnings[0]


def test_environment_variables_configure_and_flags_override_them(
    tmp_path: Path, started: list[Serve | BrokerProcess]
) -> None:
    pidfile = tmp_path / "streamq.pid"
    env = {
        "STREAMQ_DATA_DIR": str(tmp_path / "env-data"),
        "STREAMQ_AMQP_PORT": "0",
        "STREAMQ_HTTP_PORT": "1",  # a privileged port: the flag below must win
        "STREAMQ_PIDFILE": str(pidfile),
    }
    broker = Serve(["--http-port", "0"], env)
    started.append(broker)
    assert (tmp_path / "env-data" / ".lock").exists()
    assert pidfile.read_text() == f"{broker.process.pid}\n"
    assert broker.http_port != 1
    round_trip(broker.amqp_port)
    assert broker.stop() == 0
    assert not pidfile.exists()  # removed at a clean shutdown


def test_print_config_shows_the_sources_and_starts_nothing(tmp_path: Path) -> None:
    ini = tmp_path / "q.ini"
    ini.write_text("[main]\ndata_dir = from-file\n[amqp]\nport = 1111\nheartbeat = 5\n")
    result = run(
        "serve", "--config", str(ini), "--amqp-port", "2222", "--print-config",
        env={"STREAMQ_HEARTBEAT": "7", "STREAMQ_DATA_DIR": str(tmp_path / "never")},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = {line.split()[0]: line.split()[2:] for line in result.stdout.decode().splitlines()}
    assert lines["amqp_port"] == ["2222", "(flag", "--amqp-port)"]
    assert lines["heartbeat"] == ["7", "(env", "STREAMQ_HEARTBEAT)"]
    assert lines["data_dir"] == [str(tmp_path / "never"), "(env", "STREAMQ_DATA_DIR)"]
    assert lines["frame_max"] == ["131072", "(default)"]
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[amqp]\nport = 99999\n", "{ini}:2: [amqp] port: port out of range 0-65535: 99999"),
        ("[main]\nlog_level = chatty\n", "{ini}:2: [main] log_level: not a log level"),
        ("[main]\n\nthis is not ini\n", "{ini}:3: not a section, a `key = value` line"),
        ("[amqp]\nport = 1\nport = 2\n", "{ini}:3: [amqp] port: given twice (first on line 2)"),
    ],
)
def test_a_bad_config_file_is_refused_with_file_line_and_key(
    tmp_path: Path, text: str, message: str
) -> None:
    ini = tmp_path / "bad.ini"
    ini.write_text(text)
    result = run("serve", "--config", str(ini), "--data-dir", str(tmp_path / "data"))
    assert result.returncode == 1
    assert result.stderr.decode().startswith(f"streamq: {message.format(ini=ini)}")
    assert b"Traceback" not in result.stderr
    assert not (tmp_path / "data").exists()


def test_missing_config_file_and_bad_environment_are_refused(tmp_path: Path) -> None:
    missing = run("serve", "--config", str(tmp_path / "absent.ini"))
    assert missing.returncode == 1
    assert f"{tmp_path / 'absent.ini'}: cannot read the config file".encode() in missing.stderr
    bad = run("serve", env={"STREAMQ_AMQP_PORT": "fifty"})
    assert bad.returncode == 1
    assert (
        bad.stderr
        == b"streamq: environment variable STREAMQ_AMQP_PORT: not a port number: 'fifty'\n"
    )


def test_an_unwritable_pidfile_is_a_start_up_error(tmp_path: Path) -> None:
    pidfile = tmp_path / "no-such-dir" / "streamq.pid"
    result = run(
        "serve", "--data-dir", str(tmp_path / "data"), "--amqp-port", "0", "--http-port", "0",
        "--pidfile", str(pidfile),
    )  # fmt: skip
    assert result.returncode == 1
    assert f"streamq: cannot write the pidfile {pidfile}: No such file".encode() in result.stderr
    assert b"Traceback" not in result.stderr


def test_definitions_are_loaded_before_the_first_client(
    tmp_path: Path, started: list[Serve | BrokerProcess]
) -> None:
    broker = BrokerProcess(tmp_path / "data", "--config", str(_ini(tmp_path, DEFINITIONS)))
    started.append(broker)
    # The first connection, as soon as the broker listens, finds the imported entities.
    with connect(broker.amqp_port, "app1", "app-secret", "prod") as connection:
        channel = connection.channel()
        for queue in ("orders", "work", "events"):
            channel.queue_declare(queue, passive=True)
    assert b"loaded definitions from" in broker.stderr
    assert broker.stop() == 0
    # Loading again at the next start changes nothing (the import is idempotent).
    again = BrokerProcess(tmp_path / "data", "--config", str(_ini(tmp_path, DEFINITIONS)))
    started.append(again)
    with connect(again.amqp_port, "admin1", "admin-secret", "prod") as connection:
        connection.channel().queue_declare("orders", passive=True)
    assert again.stop() == 0


def _ini(tmp_path: Path, definitions: Path) -> Path:
    ini = tmp_path / "defs.ini"
    ini.write_text(f"[main]\nload_definitions = {definitions}\n")
    return ini


@pytest.mark.parametrize(
    ("content", "reason"),
    [(b"{not json", "not JSON"), (b"[]", "not a definitions document"), (None, "cannot read")],
)
def test_a_bad_definitions_file_is_a_start_up_error(
    tmp_path: Path, content: bytes | None, reason: str
) -> None:
    path = tmp_path / "defs.json"
    if content is not None:
        path.write_bytes(content)
    result = run(
        "serve", "--data-dir", str(tmp_path / "data"), "--amqp-port", "0", "--http-port", "0",
        env={"STREAMQ_LOAD_DEFINITIONS": str(path)},
    )  # fmt: skip
    assert result.returncode == 1
    assert f"streamq: load_definitions {path}: {reason}".encode() in result.stderr
    assert b"Traceback" not in result.stderr
    assert b"listening" not in result.stderr


def test_default_user_replaces_guest_on_a_fresh_data_dir(
    tmp_path: Path, started: list[Serve | BrokerProcess]
) -> None:
    ini = tmp_path / "admin.ini"
    ini.write_text(
        f"[main]\ndefault_user = admin\ndefault_password_hash = {hash_password('s3cret')}\n"
    )
    broker = BrokerProcess(tmp_path / "data", "--config", str(ini))
    started.append(broker)
    round_trip(broker.amqp_port, "admin", "s3cret")
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        connect(broker.amqp_port, "guest", "guest")
    assert broker.stop() == 0
    # The first user stays the first user: a start without the setting has no guest.
    plain = BrokerProcess(tmp_path / "data")
    started.append(plain)
    round_trip(plain.amqp_port, "admin", "s3cret")
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        connect(plain.amqp_port, "guest", "guest")
    assert plain.stop() == 0
    # An existing data directory is left alone: another default user is not added.
    other = BrokerProcess(tmp_path / "data", "--default-user", "someone-else")
    started.append(other)
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        connect(other.amqp_port, "someone-else", "guest")
    assert other.stop() == 0


def test_log_file_takes_the_log(tmp_path: Path, started: list[Serve | BrokerProcess]) -> None:
    log = tmp_path / "streamq.log"
    ini = tmp_path / "log.ini"
    ini.write_text(f"[main]\nlog_file = {log}\n")
    process = subprocess.Popen(
        streamq(
            "serve", "--config", str(ini), "--data-dir", str(tmp_path / "data"),
            "--amqp-port", "0", "--http-port", "0",
        ),
        stderr=subprocess.PIPE,
        env=_base_env(),
    )  # fmt: skip
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    try:
        while not (log.exists() and LISTENING.search(log.read_bytes())):
            assert process.poll() is None, "broker exited"
            assert time.monotonic() < deadline, "no 'listening' line in the log file"
            time.sleep(0.05)
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=STARTUP_TIMEOUT_S) == 0
    assert process.stderr is not None
    assert process.stderr.read() == b""
    assert b"stopped" in log.read_bytes()


def test_log_level_from_the_environment_is_applied(tmp_path: Path) -> None:
    """At level warning the config file's warning is logged and the INFO lines of a clean
    start and stop are not. The pidfile, written once the broker runs its event loop,
    says when SIGTERM will be handled."""
    ini = tmp_path / "warn.ini"
    ini.write_text("[main]\nsocket_buffer_size = 1\n")
    pidfile = tmp_path / "streamq.pid"
    process = subprocess.Popen(
        streamq(
            "serve", "--config", str(ini), "--data-dir", str(tmp_path / "data"),
            "--amqp-port", "0", "--http-port", "0", "--pidfile", str(pidfile),
        ),
        stderr=subprocess.PIPE,
        env=_base_env() | {"STREAMQ_LOG_LEVEL": "warning"},
    )  # fmt: skip
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    try:
        while not pidfile.exists():
            assert process.poll() is None, "broker exited"
            assert time.monotonic() < deadline, "no pidfile"
            time.sleep(0.05)
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=STARTUP_TIMEOUT_S)
    assert process.stderr is not None
    stderr = process.stderr.read()
    assert code == 0, stderr
    assert b" WARNING streamq: config file" in stderr
    assert b" INFO " not in stderr
