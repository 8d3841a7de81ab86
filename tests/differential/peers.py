"""Reference brokers for the differential tests: Debian's RabbitMQ, started by the tests
on free loopback ports with a data directory of its own, and LavinMQ where it is built.

Every process here is one the tests started; each is stopped by its pid. RabbitMQ's Erlang
port mapper (epmd) runs on a port of our own too, so a RabbitMQ the machine may already
run is never touched, and it is asked to stop through that port.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.ports import free_port

__all__ = ["Endpoint", "LavinMQServer", "RabbitMQServer", "TlsFiles", "free_port"]

RABBITMQ_SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
START_TIMEOUT_S = 90.0  # RabbitMQ takes 10-15 s on two cores; CI machines can be slower
STOP_TIMEOUT_S = 20.0
# How often RabbitMQ's queues, channels and quorum queues report their figures, and its
# management database takes them in (5 s each by default): the scenarios that read them
# wait for them to settle.
STATISTICS_INTERVAL_MS = 500
# The management database's finest sample (1 s here) sets how often it collects.
STATISTICS_CONFIG = (
    f"collect_statistics_interval = {STATISTICS_INTERVAL_MS}\n"
    "management.sample_retention_policies.global.minute = 1\n"
    "management.sample_retention_policies.global.hour = 60\n"
    "management.sample_retention_policies.basic.minute = 1\n"
    "management.sample_retention_policies.detailed.10 = 1\n"
)


def http_ready(port: int) -> bool:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/overview")
    token = base64.b64encode(b"guest:guest").decode()
    request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError):
        return False


@dataclass
class Endpoint:
    """Where a broker listens, as the scenarios see it."""

    name: str
    amqp_port: int
    http_port: int


@dataclass(frozen=True)
class TlsFiles:
    """A server certificate, its key and the CA file for RabbitMQ's TLS listener."""

    cert: Path
    key: Path
    ca: Path


def tls_config(port: int, files: TlsFiles) -> str:
    """rabbitmq.conf lines for an AMQPS listener on 127.0.0.1:port (no client
    certificates asked, as streamq's default)."""
    return (
        f"listeners.ssl.default = 127.0.0.1:{port}\n"
        f"ssl_options.cacertfile = {files.ca}\n"
        f"ssl_options.certfile = {files.cert}\n"
        f"ssl_options.keyfile = {files.key}\n"
        "ssl_options.verify = verify_none\n"
        "ssl_options.fail_if_no_peer_cert = false\n"
    )


# The plugins of the shovel and federation tests (rabbitmq-plugins' names), on top of
# the management plugin every RabbitMQServer has.
LINK_PLUGINS = (
    "rabbitmq_shovel",
    "rabbitmq_shovel_management",
    "rabbitmq_federation",
    "rabbitmq_federation_management",
)


class RabbitMQServer:
    """Debian's rabbitmq-server with the management plugin (and `plugins`), on loopback
    ports of its own, in `directory`, and with `tls` an AMQPS listener on `amqps_port`
    too. Raises RuntimeError, with the end of its log, if it does not start."""

    def __init__(
        self,
        directory: Path,
        tls: TlsFiles | None = None,
        plugins: tuple[str, ...] = (),
        extra_config: str = "",
    ) -> None:
        """`extra_config`: more rabbitmq.conf lines (a plugin's listener, say)."""
        if not RABBITMQ_SERVER.exists():
            raise RuntimeError(
                f"{RABBITMQ_SERVER} is missing: `make test` installs Debian's rabbitmq-server "
                "(as root), or run `sudo apt-get install rabbitmq-server` once"
            )
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.amqp_port, self.http_port = free_port(), free_port()
        self.epmd_port, dist_port = free_port(), free_port()
        self.endpoint = Endpoint("rabbitmq", self.amqp_port, self.http_port)
        self.amqps_port = free_port() if tls is not None else -1
        (directory / "rabbitmq.conf").write_text(
            f"listeners.tcp.1 = 127.0.0.1:{self.amqp_port}\n"
            f"management.tcp.port = {self.http_port}\n"
            "management.tcp.ip = 127.0.0.1\n"
            "log.console = false\n"
            + STATISTICS_CONFIG
            + (tls_config(self.amqps_port, tls) if tls else "")
            + extra_config
        )
        (directory / "advanced.config").write_text(
            f"[{{rabbit, [{{quorum_tick_interval, {STATISTICS_INTERVAL_MS}}}]}}].\n"
        )
        enabled = ",".join(("rabbitmq_management", *plugins))
        (directory / "enabled_plugins").write_text(f"[{enabled}].\n")
        # One node name per directory: a test may run two nodes side by side.
        suffix = re.sub(r"[^A-Za-z0-9_-]", "_", directory.name)
        self.node = f"streamq-differential-{os.getpid()}-{suffix}@localhost"
        self.env = {
            **os.environ,
            "HOME": str(directory),  # the Erlang cookie is written here
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_DIST_PORT": str(dist_port),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
            "RABBITMQ_MNESIA_BASE": str(directory / "mnesia"),
            "RABBITMQ_LOG_BASE": str(directory / "log"),
            "RABBITMQ_CONFIG_FILE": str(directory / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(directory / "advanced.config"),
            "RABBITMQ_CONF_ENV_FILE": str(directory / "rabbitmq-env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(directory / "enabled_plugins"),
            "RABBITMQ_PLUGINS_EXPAND_DIR": str(directory / "plugins-expand"),
            "RABBITMQ_PID_FILE": str(directory / "pid"),
        }
        self.output = open(directory / "server.out", "wb")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(
            [str(RABBITMQ_SERVER)], env=self.env, stdout=self.output, stderr=subprocess.STDOUT
        )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not http_ready(self.http_port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"RabbitMQ did not start:\n{self.log_tail()}")
            time.sleep(0.2)

    def log_tail(self) -> str:
        text = (self.directory / "server.out").read_bytes().decode(errors="replace")
        for log in (self.directory / "log").glob("*.log"):
            text += log.read_text(errors="replace")
        return text[-4000:]

    def _beam_pid(self) -> int | None:
        """The Erlang VM's pid: the wrapper script we started runs it as its child."""
        with contextlib.suppress(OSError, ValueError):
            return int((self.directory / "pid").read_text().strip())
        return None

    def stop(self) -> None:
        """SIGTERM to the VM (RabbitMQ stops in order), SIGKILL after a bound; then our
        epmd is asked to stop through its own port."""
        beam = self._beam_pid()
        if beam is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(beam, signal.SIGTERM)
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            if beam is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(beam, signal.SIGKILL)
            self.process.kill()
            self.process.wait(STOP_TIMEOUT_S)
        epmd = shutil.which("epmd")
        if epmd is not None:
            subprocess.run(
                [epmd, "-kill"],
                check=False,
                env=self.env,
                capture_output=True,
                timeout=STOP_TIMEOUT_S,
            )
        self.output.close()


class LavinMQServer:
    """A LavinMQ binary built from source (docs/compatibility.md says how), on loopback
    ports of its own, in `directory`."""

    def __init__(self, binary: Path, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.amqp_port, self.http_port = free_port(), free_port()
        self.endpoint = Endpoint("lavinmq", self.amqp_port, self.http_port)
        self.output = open(directory / "server.out", "wb")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(
            [
                str(binary),
                "-D",
                str(directory / "data"),
                "-b",
                "127.0.0.1",
                "-p",
                str(self.amqp_port),
                "--http-port",
                str(self.http_port),
            ],
            stdout=self.output,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not http_ready(self.http_port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("LavinMQ did not start")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(STOP_TIMEOUT_S)
        self.output.close()
