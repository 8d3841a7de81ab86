"""AMQP over WebSocket from a browser: headless Chromium runs LavinMQ's JavaScript client,
@cloudamqp/amqp-client (its browser build; `npm ci` installs the version pinned in
amqp_client/package-lock.json), against the broker's HTTP port. The page
(amqp_client/index.html, served from a loopback HTTP server of the test's own: module
scripts do not load from file://) publishes with confirms, consumes with acks and reports
into the page; the test checks the broker's side over the management API and pika. The
page's origin (http://127.0.0.1:<its port>) is not the broker's: the broker lists it in
`websocket_allow_origins`, as an operator serving a browser app elsewhere would; without
that, the same page logging in as guest is refused (cross-site WebSocket hijacking,
docs/websocket.md "Origins")."""

from __future__ import annotations

import functools
import http.server
import json
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.integration.conftest import RunningBroker

CLIENT_DIR = Path(__file__).parent / "amqp_client"
NPM_TIMEOUT_S = 120
PAGE_TIMEOUT_S = 30
COUNT = 50
BIG_BYTES = 200_000  # over the client's frame_max (8 KiB): 25 body frames, one message


@pytest.fixture(scope="module")
def amqp_client() -> Path:
    node, npm = shutil.which("node"), shutil.which("npm")
    assert node and npm, "Node.js and npm are part of the development machine (docs: env)"
    if not (CLIENT_DIR / "node_modules" / "@cloudamqp" / "amqp-client").is_dir():
        subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"],
            cwd=CLIENT_DIR,
            check=True,
            timeout=NPM_TIMEOUT_S,
            capture_output=True,
        )
    return CLIENT_DIR


class _PageHandler(http.server.SimpleHTTPRequestHandler):
    # Chromium runs module scripts only when served with a JavaScript type.
    extensions_map = {
        **http.server.SimpleHTTPRequestHandler.extensions_map,
        ".mjs": "text/javascript",
    }

    def log_message(self, format: str, *args: object) -> None:
        pass  # no access log in the test output


@pytest.fixture
def page_server(amqp_client: Path) -> Iterator[int]:
    """A loopback HTTP server for the page and the client's files; yields its port."""
    handler = functools.partial(_PageHandler, directory=str(amqp_client))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()
    thread.join(PAGE_TIMEOUT_S)


@pytest.fixture
def page_broker(tmp_path: Path, page_server: int) -> Iterator[RunningBroker]:
    """A broker that lets the page's origin in (and counts it as local for guest)."""
    running = RunningBroker(
        tmp_path / "data", websocket_allow_origins=f"http://127.0.0.1:{page_server}"
    )
    yield running
    running.stop()


def _connections(broker: RunningBroker) -> list[dict[str, object]]:
    status, body, _ = broker.http("GET", "/api/connections")
    assert status == 200 and isinstance(body, list)
    return body


def test_browser_publishes_with_confirms_and_consumes_over_websocket(
    page_broker: RunningBroker, driver: webdriver.Chrome, page_server: int
) -> None:
    broker = page_broker
    driver.get(
        f"http://127.0.0.1:{page_server}/index.html"
        f"?port={broker.http_port}&count={COUNT}&big={BIG_BYTES}"
    )
    result_text = WebDriverWait(driver, PAGE_TIMEOUT_S).until(
        lambda d: d.find_element(By.ID, "result").text
    )
    result = json.loads(result_text)
    assert result["ok"], result.get("error")
    assert result["tags"] == list(range(1, COUNT + 1))  # every publish confirmed, in order
    assert result["bigTag"] == COUNT + 1
    assert result["bodies"] == [f"m{n}" for n in range(COUNT)]
    # The broker's side: the browser's connection, on the HTTP port, named by the client.
    (listed,) = _connections(broker)
    assert listed["port"] == broker.http_port
    assert listed["peer_host"] == "127.0.0.1"
    properties = listed["client_properties"]
    assert isinstance(properties, dict) and properties["connection_name"] == "browser-test"
    # Every message consumed was acked; the large one is stored whole.
    assert broker.http("GET", "/api/queues/%2F/browser")[1]["messages"] == 0  # type: ignore[index]
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.amqp_port))
    method, _, body = connection.channel().basic_get("browser-kept", auto_ack=True)
    connection.close()
    assert method is not None and body == b"b" * BIG_BYTES
    # The browser closes the connection (connection.close over the WebSocket).
    assert driver.execute_script("return window.closeAmqp()") == "closed"
    deadline = time.monotonic() + PAGE_TIMEOUT_S
    while any(c["port"] == broker.http_port for c in _connections(broker)):
        assert time.monotonic() < deadline, "the browser's connection is still listed"
        time.sleep(0.05)


def test_a_page_of_another_origin_cannot_log_in_as_guest(
    broker: RunningBroker, driver: webdriver.Chrome, page_server: int
) -> None:
    # No allowed origins: the page (another origin, as any site's would be) reaches the
    # broker from loopback, but guest is loopback-only and the page is not local.
    driver.get(f"http://127.0.0.1:{page_server}/index.html?port={broker.http_port}&count=1&big=1")
    result_text = WebDriverWait(driver, PAGE_TIMEOUT_S).until(
        lambda d: d.find_element(By.ID, "result").text
    )
    result = json.loads(result_text)
    assert not result["ok"], result
    assert "ACCESS_REFUSED - Login was refused" in result["error"], result  # 403, as over TCP
    assert _connections(broker) == []
    assert broker.http("GET", "/api/queues/%2F/browser")[0] == 404  # nothing was declared
