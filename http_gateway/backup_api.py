"""`POST /api/backup`: a consistent copy of the running broker's data directory.

Owns the request and its answer; the backup itself is `streamq.broker.backup`. The body
is `{"directory": "/abs/path", "links": true}`: a directory on the broker's host, empty
or missing, outside the data directory (400 otherwise); `links` false copies sealed
segments instead of hard-linking them. The reply, once the backup is complete and
durable, is its report (the manifest written into the directory). 409 while another
backup runs, 500 when one fails (the directory is emptied again). `administrator` only:
the broker writes where the request says. RabbitMQ has no such endpoint (its data
directory is copied with the node stopped); this is streamq's own.
"""

from __future__ import annotations

from typing import Final

from aiohttp import web

from http_gateway.context import administrator, read_json_object
from http_gateway.errors import HttpError
from streamq.broker.backup import Backups
from streamq.broker.backup_files import BackupFailed, BackupRefused

routes = web.RouteTableDef()

BACKUPS: Final = Backups()  # process-wide, as the file tap a backup installs


@routes.post("/api/backup")
async def post_backup(request: web.Request) -> web.Response:
    who = administrator(request)
    body = await read_json_object(request)
    directory = body.get("directory")
    links = body.get("links", True)
    if not isinstance(directory, str) or not directory:
        raise HttpError(400, 'the body needs "directory": an absolute path on the broker\'s host')
    if not isinstance(links, bool):
        raise HttpError(400, '"links" must be true or false')
    if BACKUPS.running is not None:
        raise HttpError(409, f"a backup into {BACKUPS.running} is already running")
    try:
        report = await BACKUPS.take(who.broker, directory, links=links)
    except BackupRefused as exc:
        raise HttpError(400, str(exc)) from None
    except BackupFailed as exc:
        raise HttpError(500, f"backup failed: {exc}") from None
    except OSError as exc:
        raise HttpError(500, f"backup failed: {exc}") from None
    return web.json_response(report.as_json())
