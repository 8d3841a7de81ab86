"""Every route build_app registers is described in http_gateway/openapi.yaml.

Method: list the app's routes (regex alternatives such as {kind:policies|operator-policies}
expanded, path parameters normalised to {}), read the paths and methods of the YAML file
by its layout (two-space path keys, four-space method keys) and compare.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from aiohttp import web

from http_gateway.openapi_api import OPENAPI_PATH
from http_gateway.server import build_app
from streamq.broker.broker import Broker

UI_PATHS = frozenset({"/", "/static/{}"})  # the web UI's pages, not API
PARAMETER = re.compile(r"\{[^}]*\}")
CHOICE = re.compile(r"\{(\w+):([\w|-]+)\}")


def expand(formatter: str) -> Iterator[str]:
    """`/api/{kind:a|b}/{vhost}` as `/api/a/{}` and `/api/b/{}`."""
    match = CHOICE.search(formatter)
    if match is None:
        yield PARAMETER.sub("{}", formatter)
        return
    for choice in match[2].split("|"):
        yield from expand(formatter[: match.start()] + choice + formatter[match.end() :])


def registered(app: web.Application) -> set[tuple[str, str]]:
    found = set()
    for route in app.router.routes():
        if route.method == "HEAD" or route.resource is None:
            continue
        info = route.resource.get_info()
        pattern = info.get("pattern")
        raw = str(info.get("path") or info.get("formatter") or "")
        if pattern is not None:  # the formatter drops regex alternatives: rebuild them
            raw = re.sub(r"\(\?P<(\w+)>([\w|-]+)\)", r"{\1:\2}", pattern.pattern)
            raw = re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", raw).lstrip("^").rstrip("$")
            raw = raw.replace("\\", "")
        for path in expand(raw):
            if path not in UI_PATHS:
                found.add((route.method.lower(), path))
    return found


def described(text: str) -> set[tuple[str, str]]:
    found = set()
    path = ""
    for line in text.splitlines():
        if match := re.match(r"^  (/\S*):\s*$", line):
            path = PARAMETER.sub("{}", match[1])
        elif match := re.match(r"^    (get|put|post|delete|patch):\s*$", line):
            found.add((match[1], path))
    return found


def test_every_route_is_described(tmp_path: Path) -> None:
    broker = Broker(str(tmp_path))
    try:
        routes = registered(build_app(broker))
    finally:
        broker.close()
    spec = described(OPENAPI_PATH.read_text())
    assert ("get", "/api/users/{}") in routes and ("put", "/api/policies/{}/{}") in routes
    missing = sorted(routes - spec, key=lambda r: (r[1], r[0]))
    assert not missing, "routes missing from openapi.yaml: " + ", ".join(
        f"{m.upper()} {p}" for m, p in missing
    )
    stale = sorted(spec - routes, key=lambda r: (r[1], r[0]))
    assert not stale, "openapi.yaml describes routes that do not exist: " + str(stale)
