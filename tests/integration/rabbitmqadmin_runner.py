"""RabbitMQ's own rabbitmqadmin, run against streamq's management API by
tests/integration/test_rabbitmqadmin.py, test_rabbitmqadmin_admin.py and
test_http_measured_fields.py: the script that Debian's rabbitmq-server package ships
(found with `dpkg -L`, taken out of the management plugin's .ez archive where it is
zipped), run in a subprocess against the in-process broker (`Admin`), and the calls the
tests check the broker with."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from tests.integration.conftest import RunningBroker

RUN_TIMEOUT_S = 60
PACKAGE = "rabbitmq-server"
SCRIPT_NAME = "rabbitmqadmin"
PLUGIN_GLOBS = (
    "/usr/lib/rabbitmq/lib/rabbitmq_server-*/plugins/rabbitmq_management-*/priv/www/cli/"
    + SCRIPT_NAME,
    "/usr/lib/rabbitmq/lib/rabbitmq_server-*/plugins/rabbitmq_management-*.ez",
)
EZ_MEMBER_SUFFIX = "/priv/www/cli/" + SCRIPT_NAME


def _package_files() -> list[str]:
    """The files Debian's rabbitmq-server package installed, or [] without dpkg."""
    if shutil.which("dpkg") is None:
        return []
    listed = subprocess.run(
        ["dpkg", "-L", PACKAGE], check=False, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    return listed.stdout.splitlines() if listed.returncode == 0 else []


def _from_ez(archive: Path, into: Path) -> Path | None:
    """rabbitmqadmin extracted from a plugin's .ez (zip) archive into `into`, if it is there."""
    with zipfile.ZipFile(archive) as ez:
        for member in ez.namelist():
            if member.endswith(EZ_MEMBER_SUFFIX):
                out = into / SCRIPT_NAME
                out.write_bytes(ez.read(member))
                return out
    return None


@pytest.fixture(scope="session")
def rabbitmqadmin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The rabbitmqadmin of the installed rabbitmq-server: the management plugin's copy
    (extracted when the plugin is a .ez archive), else the one on the PATH. Fails, not
    skips, when the package is missing: `make test` installs it."""
    candidates = _package_files()
    for pattern in PLUGIN_GLOBS:
        candidates += glob.glob(pattern)
    plain = [
        path
        for path in candidates
        if path.endswith("/" + SCRIPT_NAME) and "/cli/" in path and os.path.isfile(path)
    ]
    if plain:
        return Path(plain[0])
    for archive in (p for p in candidates if p.endswith(".ez") and "rabbitmq_management-" in p):
        found = _from_ez(Path(archive), tmp_path_factory.mktemp("rabbitmqadmin"))
        if found is not None:
            return found
    on_path = [p for p in candidates if p.endswith("/bin/" + SCRIPT_NAME)]
    on_path += [p for p in [shutil.which(SCRIPT_NAME)] if p is not None]
    if on_path:
        return Path(on_path[0])
    pytest.fail(
        "rabbitmqadmin not found: these tests run RabbitMQ's own rabbitmqadmin, shipped by "
        f"Debian's {PACKAGE} package (apt-get install {PACKAGE}; the Makefile installs it)"
    )


class Admin:
    """rabbitmqadmin as guest against one broker, in a clean HOME (no ~/.rabbitmqadmin.conf)."""

    def __init__(self, script: Path, broker: RunningBroker, home: Path) -> None:
        self.script = script
        self.broker = broker
        self.env = {**os.environ, "HOME": str(home)}
        self.env.pop("USERPROFILE", None)

    def run(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, str(self.script), "-H", "127.0.0.1"]
        command += ["-P", str(self.broker.http_port), "-u", "guest", "-p", "guest", "-t", "30"]
        return subprocess.run(
            [*command, *args],
            check=False,  # callers check the exit status: some runs must fail
            input=stdin,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            env=self.env,
        )

    def ok(self, *args: str, stdin: str | None = None) -> str:
        """The standard output of a run that must succeed."""
        done = self.run(*args, stdin=stdin)
        assert done.returncode == 0, f"rabbitmqadmin {' '.join(args)}: {done.stderr}"
        return done.stdout

    def fails(self, *args: str) -> str:
        """The error of a run that must fail (rabbitmqadmin prints the API's reason)."""
        done = self.run(*args)
        assert done.returncode == 1, f"rabbitmqadmin {' '.join(args)} succeeded: {done.stdout}"
        return done.stderr

    def raw(self, *args: str) -> object:
        """`-f raw_json` output, parsed."""
        return json.loads(self.ok("-f", "raw_json", *args))

    def tsv(self, *args: str) -> list[dict[str, str]]:
        """`-f tsv` output: one dict per row, by the header line's column names."""
        lines = self.ok("-f", "tsv", *args).splitlines()
        if lines == ["No items"]:
            return []
        header = lines[0].split("\t")
        return [dict(zip(header, line.split("\t"), strict=True)) for line in lines[1:]]


@pytest.fixture
def admin(rabbitmqadmin: Path, broker: RunningBroker, tmp_path: Path) -> Admin:
    home = tmp_path / "home"
    home.mkdir()
    return Admin(rabbitmqadmin, broker, home)


def api(broker: RunningBroker, path: str) -> object:
    """GET `path` as guest: the JSON, which must be a 200."""
    status, body, _ = broker.http("GET", path)
    assert status == 200, (path, status, body)
    return body


def status_of(broker: RunningBroker, path: str) -> int:
    return broker.http("GET", path)[0]


@pytest.fixture
def client(broker: RunningBroker) -> Iterator[pika.BlockingConnection]:
    connection = pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1",
            broker.amqp_port,
            blocked_connection_timeout=10,
            client_properties={"connection_name": "admin-test"},
        )
    )
    yield connection
    if connection.is_open:
        connection.close()


def names(items: object, key: str = "name") -> list[object]:
    assert isinstance(items, list)
    return [item[key] for item in items]
