"""The OpenAPI 3 description of the management API (`openapi.yaml` beside this module).

Owns serving it: at `/openapi.yaml` without credentials (it describes the API, it holds no
data) and at `/api/openapi.yaml` like any API path (management users). The file is read
once, in a worker thread, and kept.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Final

from aiohttp import web

OPENAPI_PATH: Final = Path(__file__).with_name("openapi.yaml")
CONTENT_TYPE: Final = "application/yaml"

routes = web.RouteTableDef()
_cache: list[bytes] = []


async def _document() -> bytes:
    if not _cache:
        _cache.append(await asyncio.to_thread(OPENAPI_PATH.read_bytes))
    return _cache[0]


@routes.get("/openapi.yaml")
@routes.get("/api/openapi.yaml")
async def openapi(request: web.Request) -> web.Response:
    del request
    return web.Response(body=await _document(), content_type=CONTENT_TYPE, charset="utf-8")
