"""`streamq ctl` vhost and user limit verbs on a running broker, over HTTP.

Owns how rabbitmqctl's limit verbs map onto RabbitMQ's management API, with rabbitmqctl's
argument forms: `set_vhost_limits [-p vhost] '{"max-connections": 10}'` replaces the
vhost's whole `vhost-limits` parameter (`PUT /api/parameters/vhost-limits/{vhost}/limits`,
as rabbitmqctl sets it), `clear_vhost_limits [-p vhost]` removes it,
`set_user_limits USER '{"max-channels": 64}'` adds or replaces the given limits of a user
(one `PUT /api/user-limits/{user}/{name}` each, after checking them all here with the
broker's own validation, so that a bad one changes nothing), `clear_user_limits USER
NAME|all`, and `list_vhost_limits` / `list_user_limits` (`--global`: every vhost; `--user`:
one user). Errors raise CtlError. The offline forms are `streamq.ctl`'s.
"""

from __future__ import annotations

import argparse
import json

from streamq.broker.account_limits import LimitInvalid, check_user_limits, check_vhost_limits
from streamq.ctlhttp.client import ApiClient, CtlError, JsonValue, path
from streamq.ctlhttp.output import Done, Result, Row, Table

LIMITS_PATH = ("parameters", "vhost-limits")


def parse_definition(text: str) -> object:
    """The JSON definition of a set_*_limits verb; CtlError in rabbitmqctl's words."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise CtlError(f"JSON decoding error. Reason: {exc}") from None


def vhost_limits_row(vhost: str, limits: object) -> Row:
    return {"vhost": vhost, "limits": json.dumps(limits or {})}


def user_limits_row(user: str, limits: object) -> Row:
    return {"user": user, "limits": json.dumps(limits or {})}


def set_vhost_limits(client: ApiClient, args: argparse.Namespace) -> Result:
    try:
        limits = check_vhost_limits(parse_definition(args.definition))
    except LimitInvalid as exc:
        raise CtlError(str(exc).strip()) from None
    body: JsonValue = {"value": dict(limits)}
    client.request("PUT", path(*LIMITS_PATH, args.vhost, "limits"), body)
    return Done(f'Set the limits of vhost "{args.vhost}" to {json.dumps(limits)}.')


def clear_vhost_limits(client: ApiClient, args: argparse.Namespace) -> Result:
    found = path(*LIMITS_PATH, args.vhost, "limits")
    if client.exists(found):
        client.request("DELETE", found)
    return Done(f'Cleared the limits of vhost "{args.vhost}".')


def list_vhost_limits(client: ApiClient, args: argparse.Namespace) -> Result:
    where = path("vhost-limits") if args.global_ else path("vhost-limits", args.vhost)
    rows = [vhost_limits_row(str(e.get("vhost")), e.get("value")) for e in client.get_list(where)]
    return Table(("vhost", "limits"), rows)


def set_user_limits(client: ApiClient, args: argparse.Namespace) -> Result:
    try:
        limits = check_user_limits(parse_definition(args.definition))
    except LimitInvalid as exc:
        raise CtlError(str(exc)) from None
    if not client.exists(path("users", args.user)):
        raise CtlError(f"no user '{args.user}'")
    for name, value in limits.items():
        client.request("PUT", path("user-limits", args.user, name), {"value": value})
    return Done(f'Set the limits {json.dumps(limits)} of user "{args.user}".')


def clear_user_limits(client: ApiClient, args: argparse.Namespace) -> Result:
    client.request("DELETE", path("user-limits", args.user, args.name))
    which = "every limit" if args.name == "all" else f'the limit "{args.name}"'
    return Done(f'Cleared {which} of user "{args.user}".')


def list_user_limits(client: ApiClient, args: argparse.Namespace) -> Result:
    where = path("user-limits", args.user) if args.user else path("user-limits")
    rows = [user_limits_row(str(e.get("user")), e.get("value")) for e in client.get_list(where)]
    return Table(("user", "limits"), rows)


def list_vhost_limits_options(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "--global", dest="global_", action="store_true", help="the limits of every vhost"
    )


def list_user_limits_options(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--user", default=None, help="the limits of this user only")
    sub.add_argument(
        "--global", dest="global_", action="store_true", help="every user's (the default)"
    )
