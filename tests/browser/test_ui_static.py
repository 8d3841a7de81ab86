"""The UI's static files over HTTP: content types, caching, CSP, no path traversal, and no
login needed for them (the API behind them still needs one)."""

from __future__ import annotations

import http.client

import pytest

from tests.integration.conftest import RunningBroker

TIMEOUT_S = 10


def fetch(
    broker: RunningBroker, path: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", broker.http_port, timeout=TIMEOUT_S)
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def test_index_is_served_with_csp_and_without_login(broker: RunningBroker) -> None:
    status, headers, body = fetch(broker, "/")
    assert status == 200
    assert headers["content-type"] == "text/html; charset=utf-8"
    assert "default-src 'self'" in headers["content-security-policy"]
    assert headers["x-content-type-options"] == "nosniff"
    assert b'<script type="module" src="/static/app.js">' in body


@pytest.mark.parametrize(
    ("name", "content_type"),
    [
        ("app.js", "text/javascript; charset=utf-8"),
        ("style.css", "text/css; charset=utf-8"),
        ("favicon.svg", "image/svg+xml; charset=utf-8"),
    ],
)
def test_static_files_have_their_content_type(
    broker: RunningBroker, name: str, content_type: str
) -> None:
    status, headers, body = fetch(broker, f"/static/{name}")
    assert status == 200
    assert headers["content-type"] == content_type
    assert headers["cache-control"] == "no-cache"
    assert body


def test_etag_revalidation_answers_304(broker: RunningBroker) -> None:
    _, headers, _ = fetch(broker, "/static/app.js")
    etag = headers["etag"]
    status, again, body = fetch(broker, "/static/app.js", {"If-None-Match": etag})
    assert status == 304
    assert again["etag"] == etag
    assert body == b""


@pytest.mark.parametrize(
    "path",
    [
        "/static/..%2Fui.py",
        "/static/..%2F..%2Fpyproject.toml",
        "/static/%2E%2E",
        "/static/../ui.py",
        "/static/nope.js",
        "/static/",
        "/static/sub/app.js",
    ],
)
def test_no_file_outside_the_static_directory(broker: RunningBroker, path: str) -> None:
    status, _, body = fetch(broker, path)
    assert status == 404
    assert b"import" not in body and b"[project]" not in body


def test_api_still_needs_a_login(broker: RunningBroker) -> None:
    status, headers, _ = fetch(broker, "/api/policies")
    assert status == 401
    assert "www-authenticate" in headers
