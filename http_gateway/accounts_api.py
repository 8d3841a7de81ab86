"""`/api/users`, `/api/vhosts`, `/api/permissions` and `/api/whoami`, as RabbitMQ has them.

Owns the account endpoints: users (list, get, put with `password` or `password_hash`,
delete and bulk delete, which close the users' connections, without permissions),
vhosts (list, get, put with description, tags and default_queue_type kept in the accounts
file, `tracing: true` refused, delete: a new vhost accepts AMQP connections when the reply goes
out, a deleted one has had its connections closed and its data removed) and permissions
(by vhost, by user, one). Changes are durable before the reply: the account store fsyncs,
in a worker thread. Users, permissions and vhost changes need `administrator`; any
management user lists the vhosts it may see.
"""

from __future__ import annotations

from typing import Final

from aiohttp import web

from http_gateway.context import (
    Caller,
    administrator,
    caller,
    read_json,
    read_json_object,
    vhost_for,
    visible_vhosts,
)
from http_gateway.errors import HttpError
from http_gateway.fields import flag
from http_gateway.listing import list_response
from http_gateway.views import NODE
from streamq.broker.account_limits import Limits
from streamq.broker.account_values import VHOST_QUEUE_TYPES, check_tags, check_vhost_metadata
from streamq.broker.accounts import (
    PERMISSION_KINDS,
    AccountValueInvalid,
    Permission,
    VHostMetadata,
)
from streamq.broker.sampler import Sampler
from streamq.broker.users import HASHING_ALGORITHM, NO_PASSWORD, User, hash_password
from streamq.broker.vhost import VHost

CLASSIC: Final = "classic"  # the queue type of a vhost without a default_queue_type
TRACING_REFUSED: Final = (
    "tracing: streamq has no firehose tracer (amq.rabbitmq.trace); "
    "a vhost is created with tracing false only"
)
BULK_DELETE_USERS_MAX: Final = 10_000

routes = web.RouteTableDef()


def user_json(user: User, limits: Limits) -> dict[str, object]:
    """A user as RabbitMQ shows it, with its limits (`{}` when it has none)."""
    return {
        "name": user.name,
        "password_hash": user.password_hash,
        "hashing_algorithm": HASHING_ALGORITHM,
        "tags": list(user.tags),
        "limits": dict(limits),
    }


def permission_json(permission: Permission) -> dict[str, object]:
    return {
        "user": permission.user,
        "vhost": permission.vhost,
        "configure": permission.configure,
        "write": permission.write,
        "read": permission.read,
    }


def vhost_json(
    vhost: VHost | None, name: str, sampler: Sampler, metadata: VHostMetadata
) -> dict[str, object]:
    """RabbitMQ's vhost object; `vhost` is None for one that failed to open."""
    shown: dict[str, object] = {"description": metadata.description, "tags": list(metadata.tags)}
    if metadata.default_queue_type is not None:
        shown["default_queue_type"] = metadata.default_queue_type
    ready = unacked = 0
    if vhost is not None:
        for queue in vhost.queues.values():
            ready += queue.message_count
            unacked += queue.cursor.unacked_count
    return {
        "name": name,
        "description": metadata.description,
        "tags": list(metadata.tags),
        "metadata": shown,
        "default_queue_type": metadata.default_queue_type or CLASSIC,
        "tracing": False,
        # By node name, as RabbitMQ (the node that queues and connections name too).
        "cluster_state": {NODE: "running" if vhost is not None else "stopped"},
        "messages": ready + unacked,
        "messages_ready": ready,
        "messages_unacknowledged": unacked,
        "message_stats": sampler.vhost_json(vhost) if vhost is not None else {},
    }


# -- whoami --------------------------------------------------------------------------------


@routes.get("/api/whoami")
async def whoami(request: web.Request) -> web.Response:
    user = caller(request).user
    return web.json_response({"name": user.name, "tags": list(user.tags)})


# -- users ---------------------------------------------------------------------------------


@routes.get("/api/users")
async def list_users(request: web.Request) -> web.Response:
    who = administrator(request)
    accounts = who.broker.accounts
    users = [user_json(u, accounts.user_limits(u.name)) for u in accounts.list_users()]
    return list_response(request, users, pageable=False)  # RabbitMQ sorts users, pages not


@routes.get("/api/users/without-permissions")
async def users_without_permissions(request: web.Request) -> web.Response:
    accounts = administrator(request).broker.accounts
    granted = {p.user for p in accounts.list_permissions()}
    return web.json_response(
        [
            user_json(u, accounts.user_limits(u.name))
            for u in accounts.list_users()
            if u.name not in granted
        ]
    )


@routes.post("/api/users/bulk-delete")
async def bulk_delete_users(request: web.Request) -> web.Response:
    who = administrator(request)
    accounts = who.broker.accounts
    names = (await read_json_object(request)).get("users")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise HttpError(400, "'users' must be a list of user names")
    if len(names) > BULK_DELETE_USERS_MAX:
        raise HttpError(400, f"at most {BULK_DELETE_USERS_MAX} users at once")
    missing = await who.broker.change_durably(accounts.delete_users, names)
    close_connections_of(who, set(names).difference(missing))
    if missing:  # RabbitMQ deletes the others and reports the first missing one
        raise HttpError(400, f"no_such_user: {', '.join(missing)}")
    return web.Response(status=204)


def close_connections_of(who: Caller, users: set[str]) -> None:
    """As RabbitMQ: a deleted user's connections close (320, "user 'x' is deleted")."""
    for client in list(who.broker.clients.values()):
        if client.user in users:
            client.close(f"user '{client.user}' is deleted")


def _user(who: Caller, name: str) -> User:
    user = who.broker.accounts.user(name)
    if user is None:
        raise HttpError(404, "Not Found")
    return user


@routes.get("/api/users/{name}")
async def get_user(request: web.Request) -> web.Response:
    who = administrator(request)
    user = _user(who, request.match_info["name"])
    return web.json_response(user_json(user, who.broker.accounts.user_limits(user.name)))


def parse_tags(value: object) -> list[str]:
    """RabbitMQ's `tags`: a comma-separated string or a list of strings. Raises HttpError."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(tag, str) for tag in value):
        return value
    raise HttpError(400, "tags must be a comma-separated string or a list of strings")


def password_hash_of(body: dict[str, object]) -> str:
    """The hash a PUT user body asks for: from `password` (which wins, as in RabbitMQ),
    from `password_hash` (+ `hashing_algorithm`), or none (password logins refused).
    Raises HttpError 400."""
    password = body.get("password")
    if password is not None:
        if not isinstance(password, str):
            raise HttpError(400, "password must be a string")
        try:
            return hash_password(password)
        except UnicodeEncodeError:
            raise HttpError(400, "password is not valid UTF-8") from None
    given = body.get("password_hash")
    if given is None:
        return NO_PASSWORD
    algorithm = body.get("hashing_algorithm", HASHING_ALGORITHM)
    if not isinstance(given, str) or algorithm != HASHING_ALGORITHM:
        raise HttpError(400, f"password_hash must be a string hashed with {HASHING_ALGORITHM}")
    return given


@routes.put("/api/users/{name}")
async def put_user(request: web.Request) -> web.Response:
    broker = administrator(request).broker
    accounts = broker.accounts
    body = await read_json_object(request)
    password_hash = password_hash_of(body)
    tags = parse_tags(body.get("tags"))
    created = await broker.change_durably(
        accounts.put_user, request.match_info["name"], password_hash, tags
    )
    return web.Response(status=201 if created else 204)


@routes.delete("/api/users/{name}")
async def delete_user(request: web.Request) -> web.Response:
    who = administrator(request)
    name = request.match_info["name"]
    _user(who, name)
    missing = await who.broker.change_durably(who.broker.accounts.delete_users, [name])
    if missing:  # deleted meanwhile by another request
        raise HttpError(404, "Not Found")
    close_connections_of(who, {name})
    return web.Response(status=204)


@routes.get("/api/users/{name}/permissions")
async def user_permissions(request: web.Request) -> web.Response:
    who = administrator(request)
    name = request.match_info["name"]
    _user(who, name)
    found = who.broker.accounts.list_permissions(user=name)
    return web.json_response([permission_json(p) for p in found])


# -- vhosts --------------------------------------------------------------------------------


@routes.get("/api/vhosts")
async def list_vhosts(request: web.Request) -> web.Response:
    who = caller(request)
    sampler = who.broker.stats_sampler
    metadata = who.broker.accounts.vhost_metadata
    shown = [vhost_json(v, v.name, sampler, metadata(v.name)) for v in visible_vhosts(who)]
    if who.is_admin or "monitoring" in who.user.tags:
        failed = sorted(who.broker.failed_vhosts)
        shown += [vhost_json(None, name, sampler, metadata(name)) for name in failed]
    return list_response(request, sorted(shown, key=lambda v: str(v["name"])))


@routes.get("/api/vhosts/{name}")
async def get_vhost(request: web.Request) -> web.Response:
    who = caller(request)
    vhost = vhost_for(who, request.match_info["name"])
    metadata = who.broker.accounts.vhost_metadata(vhost.name)
    return web.json_response(vhost_json(vhost, vhost.name, who.broker.stats_sampler, metadata))


def vhost_metadata_of(body: dict[str, object]) -> VHostMetadata:
    """The description, tags and default queue type of a PUT vhost body (absent: "", none,
    unset), and its `tracing` checked: streamq has no firehose tracer, so `true` is
    refused rather than accepted and ignored. Raises HttpError 400."""
    if flag(body, "tracing", False):
        raise HttpError(400, TRACING_REFUSED)
    description = body.get("description")
    queue_type = body.get("default_queue_type")
    if description is not None and not isinstance(description, str):
        raise HttpError(400, "description must be a string")
    if queue_type is not None and queue_type not in VHOST_QUEUE_TYPES:
        raise HttpError(400, f"invalid_queue_type: default_queue_type {queue_type!r}")
    assert queue_type is None or isinstance(queue_type, str)
    try:
        return check_vhost_metadata(
            VHostMetadata(description or "", check_tags(parse_tags(body.get("tags"))), queue_type)
        )
    except AccountValueInvalid as exc:
        raise HttpError(400, str(exc)) from None


@routes.put("/api/vhosts/{name}")
async def put_vhost(request: web.Request) -> web.Response:
    who = administrator(request)
    broker = who.broker
    name = request.match_info["name"]
    body = await read_json(request)
    if body is not None and not isinstance(body, dict):
        raise HttpError(400, "the body must be a JSON object")
    metadata = vhost_metadata_of(body or {})
    if broker.accounts.has_vhost(name):
        # As RabbitMQ 3.10 (rabbit_vhost:update/4): description and tags are replaced,
        # the default queue type is set at creation only.
        kept = broker.accounts.vhost_metadata(name).default_queue_type
        changed = VHostMetadata(metadata.description, metadata.tags, kept)
        await broker.change_durably(broker.accounts.set_vhost_metadata, name, changed)
        return web.Response(status=204)
    if await broker.create_vhost(name, metadata) is None:
        raise HttpError(503, f"vhost {name} is unavailable: {broker.failed_vhosts[name]}")
    # As RabbitMQ's management plugin (maybe_grant_full_permissions): whoever creates a
    # vhost may use it at once.
    everything = (".*", ".*", ".*")
    await broker.change_durably(broker.accounts.set_permissions, who.user.name, name, *everything)
    return web.Response(status=201)


@routes.delete("/api/vhosts/{name}")
async def delete_vhost(request: web.Request) -> web.Response:
    broker = administrator(request).broker
    name = request.match_info["name"]
    if not broker.accounts.has_vhost(name):
        raise HttpError(404, "Not Found")
    await broker.delete_vhost(name)
    return web.Response(status=204)


@routes.get("/api/vhosts/{name}/permissions")
async def vhost_permissions(request: web.Request) -> web.Response:
    accounts = administrator(request).broker.accounts
    name = request.match_info["name"]
    if not accounts.has_vhost(name):
        raise HttpError(404, "Not Found")
    return web.json_response([permission_json(p) for p in accounts.list_permissions(vhost=name)])


# -- permissions ---------------------------------------------------------------------------


@routes.get("/api/permissions")
async def list_permissions(request: web.Request) -> web.Response:
    accounts = administrator(request).broker.accounts
    found = [permission_json(p) for p in accounts.list_permissions()]
    return list_response(request, found, pageable=False)


def _permission(request: web.Request) -> tuple[Caller, str, str]:
    return administrator(request), request.match_info["vhost"], request.match_info["user"]


@routes.get("/api/permissions/{vhost}/{user}")
async def get_permission(request: web.Request) -> web.Response:
    who, vhost, user = _permission(request)
    found = who.broker.accounts.permissions(user, vhost)
    if found is None:
        raise HttpError(404, "Not Found")
    return web.json_response(permission_json(found))


def parse_permission(body: dict[str, object]) -> tuple[str, str, str]:
    """configure, write and read regexes of a PUT permissions body. Raises HttpError 400."""
    missing = [kind for kind in PERMISSION_KINDS if not isinstance(body.get(kind), str)]
    if missing:
        raise HttpError(400, f"{', '.join(missing)} missing or not a string")
    configure, write, read = (str(body[kind]) for kind in PERMISSION_KINDS)
    return configure, write, read


@routes.put("/api/permissions/{vhost}/{user}")
async def put_permission(request: web.Request) -> web.Response:
    who, vhost, user = _permission(request)
    accounts = who.broker.accounts
    regexes = parse_permission(await read_json_object(request))
    if accounts.user(user) is None or not accounts.has_vhost(vhost):
        raise HttpError(400, "vhost_or_user_not_found")
    existed = accounts.permissions(user, vhost) is not None
    await who.broker.change_durably(accounts.set_permissions, user, vhost, *regexes)
    return web.Response(status=204 if existed else 201)


@routes.delete("/api/permissions/{vhost}/{user}")
async def delete_permission(request: web.Request) -> web.Response:
    who, vhost, user = _permission(request)
    accounts = who.broker.accounts
    if accounts.permissions(user, vhost) is None:
        raise HttpError(404, "Not Found")
    await who.broker.change_durably(accounts.clear_permissions, user, vhost)
    return web.Response(status=204)
