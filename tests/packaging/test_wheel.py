"""The wheel and the sdist as a user gets them (docs/operations.md, "Install from the
wheel"): what each holds, and the wheel installed by pip in a fresh venv with no compiler
reachable, whose `streamq serve` answers a real AMQP client and the HTTP API."""

from __future__ import annotations

import base64
import json
import platform
import signal
import subprocess
import sys
import sysconfig
import tarfile
import time
import tomllib
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

import streamq
from tests.integration.broker_process import STARTUP_TIMEOUT_S, wait_listening
from tests.packaging.conftest import (
    INSTALL_TIMEOUT_S,
    REPO,
    Dist,
    Installed,
    no_compiler_env,
    run,
)

# The top-level packages pyproject.toml ships (setuptools' find include patterns).
PACKAGES = tuple(
    pattern.removesuffix("*")
    for pattern in tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"
    ]["find"]["include"]
)
EXT_SUFFIX: str = sysconfig.get_config_var("EXT_SUFFIX")
SOURCE_ONLY = {".c", ".h"}  # in the sdist, not in the wheel
COMMAND_TIMEOUT_S = 30
HTTP_TIMEOUT_S = 10
# The oldest glibc the C modules allow (their newest symbol is GLIBC_2.14's memcpy).
PLATFORM_TAGS = {f"manylinux_2_17_{platform.machine()}", f"manylinux2014_{platform.machine()}"}


def package_files() -> list[Path]:
    """The packages' files that tools/dist.sh builds from (those git does not ignore),
    relative to the checkout."""
    listed = run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", *PACKAGES],
        COMMAND_TIMEOUT_S,
        cwd=REPO,
    )
    return sorted(Path(name) for name in listed.split("\0") if name and (REPO / name).is_file())


def c_modules() -> list[str]:
    """The C modules' file names in a wheel: one per .c source that defines a module's init
    function (setup.py builds each, with the other units it lists beside it)."""
    return [
        str(path.with_suffix("")) + EXT_SUFFIX
        for path in package_files()
        if path.suffix == ".c" and "PyMODINIT_FUNC" in (REPO / path).read_text()
    ]


def test_sdist_holds_every_source_the_build_needs(dist: Dist) -> None:
    with tarfile.open(dist.sdist) as sdist:
        top = f"streamq-{streamq.__version__}/"
        names = {name.removeprefix(top) for name in sdist.getnames()}
    for path in package_files():
        assert str(path) in names, f"{path} is not in the sdist"
    assert {"setup.py", "pyproject.toml", "README.md", "LICENSE", "docs/changelog.md"} <= names
    assert not [name for name in names if name.endswith(".so")]


def test_wheel_holds_the_c_modules_and_every_package_file(dist: Dist) -> None:
    with zipfile.ZipFile(dist.wheel) as wheel:
        names = {name for name in wheel.namelist() if not name.endswith("/")}  # files only
        metadata = wheel.read(f"streamq-{streamq.__version__}.dist-info/WHEEL").decode()
        core = wheel.read(f"streamq-{streamq.__version__}.dist-info/METADATA").decode()
    dist_info = {name for name in names if ".dist-info/" in name}
    expected = {str(path) for path in package_files() if path.suffix not in SOURCE_ONLY}
    assert len(c_modules()) == 6  # the accelerators that setup.py lists
    assert names - dist_info == expected | set(c_modules())
    assert "Root-Is-Purelib: false" in metadata
    assert f"streamq-{streamq.__version__}.dist-info/licenses/LICENSE" in dist_info
    assert "License-Expression: Apache-2.0" in core
    # pyarrow is the Spark data source's, not the broker's (pyproject.toml's `spark` extra).
    assert 'Requires-Dist: pyarrow>=15; extra == "spark"' in core


def test_wheel_is_named_for_this_version_and_manylinux(dist: Dist) -> None:
    name, version, python_tag, abi_tag, platform_tags = dist.wheel.stem.split("-")
    assert (name, version) == ("streamq", streamq.__version__)
    assert python_tag == abi_tag == f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert set(platform_tags.split(".")) == PLATFORM_TAGS


def test_installed_without_a_compiler_with_its_c_modules(installed: Installed) -> None:
    for module in c_modules():
        assert (installed.site_packages / module).is_file(), module
    probe = "import streamq.log._records as m, streamq; print(m.__file__, streamq.__version__)"
    printed = run(
        [installed.bin("python"), "-c", probe], COMMAND_TIMEOUT_S, installed.env, cwd=installed.venv
    )
    module_file, version = printed.split()
    assert Path(module_file).parent == installed.site_packages / "streamq" / "log"
    assert version == streamq.__version__
    printed = run(
        [installed.bin("streamq"), "--version"],
        COMMAND_TIMEOUT_S,
        installed.env,
        cwd=installed.venv,
    )
    assert printed == f"streamq {streamq.__version__}\n"


def test_the_install_environment_cannot_compile(dist: Dist, tmp_path: Path) -> None:
    """The control for the test above: pip, in the environment it installed the wheel in,
    fails to install the sdist, whose C modules must be compiled."""
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], COMMAND_TIMEOUT_S)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--python"]
    done = subprocess.run(
        [*pip, str(venv / "bin" / "python"), "install", str(dist.sdist)],
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
        check=False,
        env=no_compiler_env(venv),
        cwd=tmp_path,
    )
    assert done.returncode != 0
    assert "error: Command '['/bin/false'" in done.stdout + done.stderr
    assert not list((venv / "lib").glob("python3*/site-packages/streamq"))


class InstalledBroker:
    """The installed `streamq serve` on loopback ports the OS picks."""

    def __init__(self, installed: Installed, data_dir: Path) -> None:
        argv = [
            installed.bin("streamq"),
            "serve",
            "--data-dir",
            str(data_dir),
            "--bind",
            "127.0.0.1",
        ]
        argv += ["--amqp-port", "0", "--http-port", "0", "--stream-port", "0", "--mqtt-port", "-1"]
        self.process = subprocess.Popen(
            argv, stderr=subprocess.PIPE, env=installed.env, cwd=data_dir.parent
        )
        try:
            _, self.amqp_port, self.http_port = wait_listening(self.process)
        except BaseException:
            self.process.kill()
            self.process.wait(STARTUP_TIMEOUT_S)
            raise

    def get(self, path: str) -> tuple[int, bytes]:
        """GET `path` as guest, retried until the API answers (HTTP_TIMEOUT_S)."""
        request = urllib.request.Request(f"http://127.0.0.1:{self.http_port}{path}")
        token = base64.b64encode(b"guest:guest").decode()
        request.add_header("Authorization", f"Basic {token}")
        deadline = time.monotonic() + HTTP_TIMEOUT_S
        while True:
            try:
                with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
                    return response.status, response.read()
            except urllib.error.HTTPError as error:
                return error.code, error.read()
            except urllib.error.URLError as error:  # not listening yet: refused
                assert time.monotonic() < deadline, f"no answer to GET {path}: {error}"
                time.sleep(0.1)

    def stop(self) -> tuple[int, bytes]:
        """SIGTERM to its pid; its exit status and the rest of what it logged."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        _, logged = self.process.communicate(timeout=STARTUP_TIMEOUT_S)
        return self.process.returncode, logged


@pytest.fixture
def broker(installed: Installed, tmp_path: Path) -> Iterator[InstalledBroker]:
    running = InstalledBroker(installed, tmp_path / "data")
    try:
        yield running
    finally:
        if running.process.poll() is None:
            running.process.kill()
            running.process.wait(STARTUP_TIMEOUT_S)


def test_installed_broker_serves_amqp_and_http(broker: InstalledBroker) -> None:
    params = pika.ConnectionParameters("127.0.0.1", broker.amqp_port, blocked_connection_timeout=10)
    connection = pika.BlockingConnection(params)
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("wheel", durable=True)
    channel.basic_publish("", "wheel", b"from the wheel", mandatory=True)  # raises unless confirmed
    method, _, body = channel.basic_get("wheel")
    assert method is not None
    assert body == b"from the wheel"
    channel.basic_ack(method.delivery_tag)
    connection.close()

    status, overview = broker.get("/api/overview")
    assert status == 200
    assert json.loads(overview)["product_version"] == streamq.__version__
    status, queue = broker.get("/api/queues/%2F/wheel")
    assert (status, json.loads(queue)["durable"]) == (200, True)
    status, page = broker.get("/")  # the web UI, from the wheel's static files
    assert status == 200
    assert b"<html" in page
    status, spec = broker.get("/openapi.yaml")
    assert status == 200
    assert b"\nopenapi: " in spec
    code, logged = broker.stop()
    assert code == 0, logged.decode(errors="replace")
