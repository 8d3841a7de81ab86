"""What every management API handler needs: who asks, what they may see, their JSON body.

Owns `Caller` (the broker and the authenticated user, set on each request by the auth
middleware) and the checks RabbitMQ's management plugin makes before a handler acts:
user tags (`require_tags`), vhost visibility (`visible_vhosts`, `vhost_for`) and the JSON
body (`read_json`). Handlers raise `HttpError`; they never build error responses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from aiohttp import web

from http_gateway.errors import HttpError
from streamq.broker import json_text
from streamq.broker.broker import Broker
from streamq.broker.users import User
from streamq.broker.vhost import VHost

BODY_BYTES_MAX: Final = 16 * 1024 * 1024  # definitions of a large broker fit
BROKER_KEY: Final = web.AppKey("broker", Broker)

# RabbitMQ's management tags: each grants what the ones before it do, and more.
MANAGEMENT_TAGS: Final = frozenset({"management", "policymaker", "monitoring", "administrator"})
SEES_ALL_VHOSTS_TAGS: Final = frozenset({"monitoring", "administrator"})
ADMIN_TAGS: Final = frozenset({"administrator"})


@dataclass(frozen=True, slots=True)
class Caller:
    """An authenticated request: the broker and who asks."""

    broker: Broker
    user: User

    @property
    def is_admin(self) -> bool:
        return "administrator" in self.user.tags

    def has_any_tag(self, tags: frozenset[str]) -> bool:
        return bool(tags.intersection(self.user.tags))


CALLER_KEY: Final = web.RequestKey("caller", Caller)


def caller(request: web.Request) -> Caller:
    found = request.get(CALLER_KEY)
    assert isinstance(found, Caller), "route registered without authentication"
    return found


def require_tags(who: Caller, tags: frozenset[str]) -> None:
    """Raises HttpError 403 unless the user has one of `tags`."""
    if not who.has_any_tag(tags):
        raise HttpError(403, "Not_Authorized: needs the tag " + " or ".join(sorted(tags)))


def administrator(request: web.Request) -> Caller:
    """The caller of a route for administrators only (403 for anyone else)."""
    who = caller(request)
    require_tags(who, ADMIN_TAGS)
    return who


def may_see(who: Caller, vhost: str) -> bool:
    """monitoring and administrator see every vhost; others those they have permissions on."""
    return who.has_any_tag(SEES_ALL_VHOSTS_TAGS) or who.broker.accounts.vhost_access(
        who.user.name, vhost
    )


def visible_vhosts(who: Caller) -> list[VHost]:
    return [v for name, v in sorted(who.broker.vhosts.items()) if may_see(who, name)]


def vhost_for(who: Caller, name: str) -> VHost:
    """The vhost `name` if the caller may see it. Raises HttpError 404 or 403."""
    vhost = who.broker.vhosts.get(name)
    if vhost is None:
        reason = who.broker.failed_vhosts.get(name)
        if reason is not None:
            raise HttpError(503, f"vhost {name} is unavailable: {reason}")
        raise HttpError(404, f"vhost {name} not found")
    if not may_see(who, name):
        raise HttpError(403, f"access to vhost '{name}' refused for user '{who.user.name}'")
    return vhost


async def read_json(request: web.Request) -> object:
    """The request body as JSON (empty body: None). Raises HttpError 400 or 413."""
    if request.content_length is not None and request.content_length > BODY_BYTES_MAX:
        raise HttpError(413, f"bodies are at most {BODY_BYTES_MAX} bytes")
    data = await request.read()
    if not data:
        return None
    try:
        return json_text.loads(data)
    except ValueError as exc:
        raise HttpError(400, f"the body is not JSON: {exc}") from None


async def read_json_object(request: web.Request) -> dict[str, object]:
    """The request body as a JSON object. Raises HttpError 400 or 413."""
    body = await read_json(request)
    if not isinstance(body, dict):
        raise HttpError(400, "the body must be a JSON object")
    return body
