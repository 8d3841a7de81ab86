"""The management web UI: `GET /` (the page) and `GET /static/{file}` (its modules and CSS).

Owns serving the UI's static files, shipped as package data in `http_gateway/static/`
(vanilla ES modules and one CSS file, no build step). The UI itself talks only to the
`/api/` routes, sending `Authorization: Basic` on each request; these pages need no login.

Rules: only files that exist directly in the static directory are served (a name is looked
up in that directory's listing, so `..`, encoded slashes and subpaths are 404, never a path
join); files are read once, in a worker thread, and kept (they are small and change only
with the package); every answer carries an ETag (`If-None-Match` gets 304),
`Cache-Control: no-cache` (the browser revalidates, so an upgrade shows at once), and the
UI's Content-Security-Policy (everything from this origin only, no inline script).
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass
from importlib import resources
from typing import Final

from aiohttp import web

from http_gateway.errors import HttpError

STATIC_PACKAGE: Final = "http_gateway"
STATIC_DIR: Final = "static"
INDEX_FILE: Final = "index.html"
CONTENT_TYPES: Final = {
    ".html": "text/html",
    ".js": "text/javascript",
    ".css": "text/css",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
}
TEXT_SUFFIXES: Final = frozenset({".html", ".js", ".css", ".svg"})
# `default-src 'self'` for everything; the charts are SVG built by script, so no inline
# script or style attribute is needed. data: images for the SVG favicon fallback only.
CONTENT_SECURITY_POLICY: Final = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}

routes = web.RouteTableDef()


@dataclass(frozen=True, slots=True)
class StaticFile:
    body: bytes
    content_type: str
    etag: str


class StaticFiles:
    """The static directory's files by name, read on first use and then kept."""

    def __init__(self) -> None:
        self._files: dict[str, StaticFile] | None = None

    async def get(self, name: str) -> StaticFile | None:
        # No lock: two first requests at once both read the same files, harmlessly (and a
        # module-level asyncio.Lock would tie itself to one event loop).
        if self._files is None:
            self._files = await asyncio.to_thread(_read_all)
        return self._files.get(name)


def _read_all() -> dict[str, StaticFile]:
    """Every regular file directly in the static directory with a known content type."""
    files: dict[str, StaticFile] = {}
    for entry in resources.files(STATIC_PACKAGE).joinpath(STATIC_DIR).iterdir():
        suffix = "." + entry.name.rpartition(".")[2]
        content_type = CONTENT_TYPES.get(suffix)
        if content_type is None or not entry.is_file():
            continue
        body = entry.read_bytes()
        if suffix in TEXT_SUFFIXES:
            content_type += "; charset=utf-8"
        etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
        files[entry.name] = StaticFile(body, content_type, etag)
    return files


STATIC_FILES: Final = StaticFiles()


def _respond(request: web.Request, found: StaticFile) -> web.Response:
    headers = {"ETag": found.etag, "Cache-Control": "no-cache", **SECURITY_HEADERS}
    if found.etag in request.headers.get("If-None-Match", ""):
        return web.Response(status=304, headers=headers)
    headers["Content-Type"] = found.content_type
    return web.Response(body=found.body, headers=headers)


@routes.get("/")
async def index(request: web.Request) -> web.Response:
    found = await STATIC_FILES.get(INDEX_FILE)
    if found is None:
        raise HttpError(404, "the web UI is not installed")
    return _respond(request, found)


@routes.get("/static/{name}")
async def static_file(request: web.Request) -> web.Response:
    found = await STATIC_FILES.get(request.match_info["name"])
    if found is None:
        raise HttpError(404, "no such file")
    return _respond(request, found)
