"""`streamq ctl` users, vhosts and permissions verbs on a running broker, over HTTP.

Owns how rabbitmqctl's account verbs map onto RabbitMQ's management API:
`/api/users`, `/api/vhosts`, `/api/permissions`, `/api/whoami`. Each function takes the
client and the parsed arguments and returns what to print; errors raise CtlError.
The offline forms of the same verbs (a stopped broker's data directory) are `streamq.ctl`.
"""

from __future__ import annotations

import argparse

from streamq.broker.users import hash_password as hash_user_password
from streamq.ctlhttp.client import ApiClient, CtlError, JsonValue, path
from streamq.ctlhttp.output import Done, Result, Row, Table, Value

PERMISSION_COLUMNS = ("configure", "write", "read")


# Users.


def list_users(client: ApiClient, args: argparse.Namespace) -> Result:
    rows: list[Row] = [
        {"user": user.get("name"), "tags": list(_tags(user.get("tags")))}
        for user in client.get_list(path("users"))
    ]
    return Table(("user", "tags"), rows)


def add_user(client: ApiClient, args: argparse.Namespace) -> Result:
    # RabbitMQ's PUT also updates an existing user; rabbitmqctl's add_user refuses to.
    if client.exists(path("users", args.name)):
        raise CtlError(f"user '{args.name}' already exists")
    client.request("PUT", path("users", args.name), {"password": args.password, "tags": ""})
    return Done(f'Added user "{args.name}".')


def delete_user(client: ApiClient, args: argparse.Namespace) -> Result:
    client.request("DELETE", path("users", args.name))
    return Done(f'Deleted user "{args.name}".')


def change_password(client: ApiClient, args: argparse.Namespace) -> Result:
    user = client.get_object(path("users", args.name))
    body: JsonValue = {"password": args.password, "tags": _tags_text(user.get("tags"))}
    client.request("PUT", path("users", args.name), body)
    return Done(f'Changed the password of user "{args.name}".')


def clear_password(client: ApiClient, args: argparse.Namespace) -> Result:
    user = client.get_object(path("users", args.name))
    # An empty hash, as RabbitMQ's passwordless users: no password logs the user in.
    body: JsonValue = {"password_hash": "", "tags": _tags_text(user.get("tags"))}
    client.request("PUT", path("users", args.name), body)
    return Done(f'Cleared the password of user "{args.name}".')


def set_user_tags(client: ApiClient, args: argparse.Namespace) -> Result:
    user = client.get_object(path("users", args.name))
    # The PUT replaces the whole user: send its hash back so that the password stays.
    body: dict[str, JsonValue] = {"tags": ",".join(args.tags)}
    if isinstance(user.get("password_hash"), str):
        body["password_hash"] = user["password_hash"]
        if isinstance(user.get("hashing_algorithm"), str):
            body["hashing_algorithm"] = user["hashing_algorithm"]
    client.request("PUT", path("users", args.name), body)
    return Done(f'Set the tags of user "{args.name}".')


def authenticate_user(client: ApiClient, args: argparse.Namespace) -> Result:
    """Log in to the API as the user: `/api/whoami` answers 200, or 401 "Not management
    user" to a right password of a user without a management tag."""
    try:
        client.as_user(args.name, args.password).get(path("whoami"))
    except CtlError as exc:
        if exc.status != 401 or "not management user" not in str(exc).lower():
            if exc.status == 401:
                raise CtlError(f'user "{args.name}" failed to authenticate') from None
            raise
    return Done(f'User "{args.name}" authenticated.')


def hash_password(client: ApiClient, args: argparse.Namespace) -> Result:
    """Computed here (no broker): RabbitMQ's salted SHA-256, for definitions files."""
    password_hash = hash_user_password(args.password)
    return Value(password_hash, password_hash)


def _tags(value: JsonValue) -> list[str]:
    """RabbitMQ answers tags as a list (3.9 on) or a comma-separated string (before)."""
    if isinstance(value, list):
        return [str(tag) for tag in value]
    if isinstance(value, str):
        return [tag for tag in value.split(",") if tag]
    return []


def _tags_text(value: JsonValue) -> str:
    return ",".join(_tags(value))


# Vhosts.


def list_vhosts(client: ApiClient, args: argparse.Namespace) -> Result:
    return Table(("name",), [{"name": v.get("name")} for v in client.get_list(path("vhosts"))])


def add_vhost(client: ApiClient, args: argparse.Namespace) -> Result:
    if client.exists(path("vhosts", args.name)):
        raise CtlError(f"vhost '{args.name}' already exists")
    client.request("PUT", path("vhosts", args.name))
    # The API grants the vhost's creator full permissions, as RabbitMQ's management
    # plugin does; rabbitmqctl add_vhost grants none, and neither does this command.
    client.request("DELETE", path("permissions", args.name, client.endpoint.user))
    return Done(f'Added vhost "{args.name}".')


def delete_vhost(client: ApiClient, args: argparse.Namespace) -> Result:
    client.request("DELETE", path("vhosts", args.name))
    return Done(f'Deleted vhost "{args.name}".')


# Permissions.


def set_permissions(client: ApiClient, args: argparse.Namespace) -> Result:
    body: JsonValue = {"configure": args.configure, "write": args.write, "read": args.read}
    client.request("PUT", path("permissions", args.vhost, args.user), body)
    return Done(f'Set the permissions of user "{args.user}" in vhost "{args.vhost}".')


def clear_permissions(client: ApiClient, args: argparse.Namespace) -> Result:
    client.request("DELETE", path("permissions", args.vhost, args.user))
    return Done(f'Cleared the permissions of user "{args.user}" in vhost "{args.vhost}".')


def list_permissions(client: ApiClient, args: argparse.Namespace) -> Result:
    entries = client.get_list(path("vhosts", args.vhost, "permissions"))
    return _permissions("user", entries)


def list_user_permissions(client: ApiClient, args: argparse.Namespace) -> Result:
    entries = client.get_list(path("users", args.user, "permissions"))
    return _permissions("vhost", entries)


def _permissions(key: str, entries: list[dict[str, JsonValue]]) -> Table:
    columns = (key, *PERMISSION_COLUMNS)
    return Table(columns, [{column: entry.get(column) for column in columns} for entry in entries])


# Topic permissions.

TOPIC_PERMISSION_COLUMNS = ("exchange", "write", "read")


def set_topic_permissions(client: ApiClient, args: argparse.Namespace) -> Result:
    body: JsonValue = {"exchange": args.exchange, "write": args.write, "read": args.read}
    client.request("PUT", path("topic-permissions", args.vhost, args.user), body)
    return Done(
        f'Set the topic permissions of user "{args.user}" on exchange "{args.exchange}" '
        f'in vhost "{args.vhost}".'
    )


def clear_topic_permissions(client: ApiClient, args: argparse.Namespace) -> Result:
    """All of the user's in the vhost, or those on one exchange: RabbitMQ 3.10's API
    clears them all, so the others are put back after (two requests, not one change)."""
    pair = path("topic-permissions", args.vhost, args.user)
    kept = []
    if args.exchange is not None:
        if not client.exists(pair):
            return Done(f'User "{args.user}" has no topic permissions in vhost "{args.vhost}".')
        kept = [t for t in client.get_list(pair) if t.get("exchange") != args.exchange]
    if client.exists(pair):
        client.request("DELETE", pair)
    for entry in kept:
        body: JsonValue = {key: entry.get(key) for key in TOPIC_PERMISSION_COLUMNS}
        client.request("PUT", pair, body)
    on = f' on exchange "{args.exchange}"' if args.exchange is not None else ""
    return Done(f'Cleared the topic permissions of user "{args.user}"{on} in vhost "{args.vhost}".')


def list_topic_permissions(client: ApiClient, args: argparse.Namespace) -> Result:
    entries = client.get_list(path("vhosts", args.vhost, "topic-permissions"))
    return _rows(("user", *TOPIC_PERMISSION_COLUMNS), entries)


def list_user_topic_permissions(client: ApiClient, args: argparse.Namespace) -> Result:
    entries = client.get_list(path("users", args.user, "topic-permissions"))
    return _rows(("vhost", *TOPIC_PERMISSION_COLUMNS), entries)


def _rows(columns: tuple[str, ...], entries: list[dict[str, JsonValue]]) -> Table:
    return Table(columns, [{column: entry.get(column) for column in columns} for entry in entries])
