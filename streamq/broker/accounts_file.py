"""The format of `<data_dir>/definitions/accounts.json`: the accounts as bytes and back.

Owns `encode` and `decode` between the file's bytes and an `AccountsRecord` (plain lists,
checked for validity and references). It does no I/O and keeps no state: the store
(streamq/broker/accounts.py) reads, writes and fsyncs the file.

File format, version 1, with the field names of RabbitMQ's definitions export:
    {"version": 1,
     "users": [{"name": "guest", "password_hash": "<base64>",
                "hashing_algorithm": "rabbit_password_hashing_sha256",
                "tags": ["administrator"]}],
     "vhosts": [{"name": "/"},
                {"name": "b", "description": "team b", "tags": ["eu"],
                 "default_queue_type": "quorum"}],
     "permissions": [{"user": "guest", "vhost": "/",
                      "configure": ".*", "write": ".*", "read": ".*"}],
     "topic_permissions": [{"user": "guest", "vhost": "/", "exchange": "amq.topic",
                            "write": "^a\\.", "read": ".*"}]}
"topic_permissions" came later within version 1: a file without it holds none; a streamq
that predates it reads a newer file, ignoring the key. So did a vhost's "description",
"tags" and "default_queue_type", written only when set (absent: "", [] and unset).

Version 2 adds limits: a vhost's `vhost-limits` parameter as "limits" in its entry (an
object, possibly empty once its last limit was cleared) and a user's limits as "limits" in
its entry (written only when it has some):
     "vhosts": [{"name": "b", "limits": {"max-connections": 10, "max-queues": -1}}],
     "users": [{"name": "app", ..., "limits": {"max-channels": 64}}]
A file is written as version 2 only when it holds limits, else as version 1, which every
streamq reads. A streamq that reads only version 1 ignores keys it does not know, so it
would run without the limits and drop them on its next write: version 2 makes it refuse
the file instead ("version 2, this streamq reads 1"). This streamq reads both.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from streamq.broker.account_limits import (
    LimitInvalid,
    Limits,
    check_user_limits,
    check_vhost_limits,
)
from streamq.broker.account_values import (
    PERMISSION_KINDS,
    AccountsCorrupted,
    AccountValueInvalid,
    Permission,
    VHostMetadata,
    check_name,
    check_tags,
    check_vhost_metadata,
    compile_regex,
)
from streamq.broker.topic_permissions import TOPIC_KINDS, TopicPermission
from streamq.broker.users import HASHING_ALGORITHM, User, is_password_hash

FORMAT_VERSION: Final = 2  # the newest this streamq reads and writes
LIMITS_VERSION: Final = 2  # the first version with "limits"
READ_VERSIONS: Final = (1, 2)
BASE_VERSION: Final = 1  # written when the file holds no limits
LIMITS_KEY: Final = "limits"
TOPIC_KEY: Final = "topic_permissions"  # absent from files written before them


@dataclass(frozen=True, slots=True)
class AccountsRecord:
    """The content of an accounts file, sorted as it is written."""

    users: list[User]
    vhosts: list[str]
    permissions: list[Permission]
    topic_permissions: list[TopicPermission]
    vhost_metadata: dict[str, VHostMetadata]  # only of vhosts that have some
    vhost_limits: dict[str, Limits]  # only of vhosts with a vhost-limits parameter
    user_limits: dict[str, Limits]  # only of users with limits


def encode(record: AccountsRecord) -> bytes:
    """The file's bytes for `record` (sorted by name, two-space indented UTF-8 JSON)."""
    users = [_encode_user(user, record.user_limits) for user in sorted(record.users, key=_name)]
    permissions = [
        {
            "user": p.user,
            "vhost": p.vhost,
            "configure": p.configure,
            "write": p.write,
            "read": p.read,
        }
        for p in sorted(record.permissions, key=lambda p: (p.vhost, p.user))
    ]
    limited = bool(record.vhost_limits or record.user_limits)
    document: dict[str, object] = {
        "version": LIMITS_VERSION if limited else BASE_VERSION,
        "users": users,
        "vhosts": [_encode_vhost(name, record) for name in sorted(record.vhosts)],
        "permissions": permissions,
    }
    document[TOPIC_KEY] = [
        {
            "user": t.user,
            "vhost": t.vhost,
            "exchange": t.exchange,
            "write": t.write,
            "read": t.read,
        }
        for t in sorted(record.topic_permissions, key=lambda t: (t.vhost, t.user, t.exchange))
    ]
    return (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode()


def _name(user: User) -> str:
    return user.name


def _encode_user(user: User, limits: dict[str, Limits]) -> dict[str, object]:
    entry: dict[str, object] = {
        "name": user.name,
        "password_hash": user.password_hash,
        "hashing_algorithm": HASHING_ALGORITHM,
        "tags": list(user.tags),
    }
    if user.name in limits:
        entry[LIMITS_KEY] = dict(limits[user.name])
    return entry


def _encode_vhost(name: str, record: AccountsRecord) -> dict[str, object]:
    entry: dict[str, object] = {"name": name}
    found = record.vhost_metadata.get(name)
    if found is not None:
        entry["description"] = found.description
        entry["tags"] = list(found.tags)
        if found.default_queue_type is not None:
            entry["default_queue_type"] = found.default_queue_type
    if name in record.vhost_limits:
        entry[LIMITS_KEY] = dict(record.vhost_limits[name])
    return entry


class _FormatError(Exception):
    """A reason the accounts file cannot be read; becomes AccountsCorrupted."""


def decode(path: str, data: bytes) -> AccountsRecord:
    """The record in `data`; raises AccountsCorrupted naming `path` if it is not valid."""
    try:
        document = _object(json.loads(data.decode("utf-8")), "the document")
        version = document.get("version")
        if type(version) is not int or version not in READ_VERSIONS:
            raise _FormatError(f"version {version!r}, this streamq reads up to {FORMAT_VERSION}")
        user_entries = _array(document, "users")
        users = [_decode_user(entry) for entry in user_entries]
        entries = _array(document, "vhosts")
        vhosts = [check_name("vhost", _string(entry, "name")) for entry in entries]
        metadata = {
            name: found
            for name, found in zip(vhosts, map(_decode_vhost_metadata, entries), strict=True)
            if found is not None
        }
        permissions = [_decode_permission(entry) for entry in _array(document, "permissions")]
        topics = [
            _decode_topic_permission(entry)
            for entry in (_array(document, TOPIC_KEY) if TOPIC_KEY in document else [])
        ]
        vhost_limits = _decode_limits(version, vhosts, entries, check_vhost_limits)
        user_limits = _decode_limits(
            version, [u.name for u in users], user_entries, check_user_limits
        )
        record = AccountsRecord(
            users, vhosts, permissions, topics, metadata, vhost_limits, user_limits
        )
        _check_references(record)
        return record
    except (
        ValueError,
        _FormatError,
        AccountValueInvalid,
        LimitInvalid,
    ) as exc:  # JSONDecodeError, UnicodeError
        raise AccountsCorrupted(path, str(exc)) from None


def _decode_limits(
    version: int,
    names: list[str],
    entries: list[object],
    check: Callable[[object], dict[str, int]],
) -> dict[str, Limits]:
    """The "limits" of the entries that have them (none before LIMITS_VERSION)."""
    if version < LIMITS_VERSION:
        return {}
    found: dict[str, Limits] = {}
    for name, entry in zip(names, entries, strict=True):
        fields = _object(entry, "an entry")
        if LIMITS_KEY in fields:
            found[name] = check(fields[LIMITS_KEY])
    return found


def _decode_user(entry: object) -> User:
    name = check_name("user", _string(entry, "name"))
    algorithm = _string(entry, "hashing_algorithm")
    if algorithm != HASHING_ALGORITHM:
        raise _FormatError(f"user '{name}': unsupported hashing_algorithm '{algorithm}'")
    password_hash = _string(entry, "password_hash")
    if not is_password_hash(password_hash):
        raise _FormatError(f"user '{name}': malformed password_hash")
    tags = _object(entry, "a user").get("tags")
    if not isinstance(tags, list) or not all(isinstance(tag, str) for tag in tags):
        raise _FormatError(f"user '{name}': tags is not a list of strings")
    return User(name, password_hash, check_tags(tags))


def _decode_vhost_metadata(entry: object) -> VHostMetadata | None:
    """A vhost entry's metadata; None when it has none (a file of an older streamq)."""
    fields = _object(entry, "a vhost")
    if not {"description", "tags", "default_queue_type"} & fields.keys():
        return None
    description = fields.get("description", "")
    tags = fields.get("tags", [])
    queue_type = fields.get("default_queue_type")
    if not isinstance(description, str) or not isinstance(queue_type, str | None):
        raise _FormatError(f"vhost {fields.get('name')!r}: malformed description or queue type")
    if not isinstance(tags, list) or not all(isinstance(tag, str) for tag in tags):
        raise _FormatError(f"vhost {fields.get('name')!r}: tags is not a list of strings")
    return check_vhost_metadata(VHostMetadata(description, tuple(tags), queue_type))


def _decode_permission(entry: object) -> Permission:
    user, vhost = _string(entry, "user"), _string(entry, "vhost")
    regexes = [_string(entry, kind) for kind in PERMISSION_KINDS]
    for kind, regex in zip(PERMISSION_KINDS, regexes, strict=True):
        compile_regex(kind, regex)
    return Permission(user, vhost, *regexes)


def _decode_topic_permission(entry: object) -> TopicPermission:
    user, vhost = _string(entry, "user"), _string(entry, "vhost")
    exchange = _string(entry, "exchange")
    regexes = [_string(entry, kind) for kind in TOPIC_KINDS]
    for kind, regex in zip(TOPIC_KINDS, regexes, strict=True):
        compile_regex(kind, regex)
    return TopicPermission(user, vhost, exchange, *regexes)


def _check_references(record: AccountsRecord) -> None:
    names = {user.name for user in record.users}
    vhosts = record.vhosts
    if len(names) != len(record.users) or len(set(vhosts)) != len(vhosts):
        raise _FormatError("a user or vhost is listed twice")
    permissions = record.permissions
    if len({(p.user, p.vhost) for p in permissions}) != len(permissions):
        raise _FormatError("permissions of a user on a vhost are listed twice")
    topics = record.topic_permissions
    if len({(t.user, t.vhost, t.exchange) for t in topics}) != len(topics):
        raise _FormatError("topic permissions of a user on an exchange are listed twice")
    pairs = [(p.user, p.vhost) for p in permissions] + [(t.user, t.vhost) for t in topics]
    for user, vhost in pairs:
        if user not in names or vhost not in vhosts:
            raise _FormatError(f"permissions of unknown user '{user}' or vhost '{vhost}'")


def _object(value: object, what: str) -> dict[str, object]:
    if not isinstance(value, dict):
        raise _FormatError(f"{what} is not a JSON object")
    return value


def _array(document: dict[str, object], key: str) -> list[object]:
    value = document.get(key)
    if not isinstance(value, list):
        raise _FormatError(f"'{key}' is not a list")
    return value


def _string(entry: object, key: str) -> str:
    value = _object(entry, f"an entry with '{key}'").get(key)
    if not isinstance(value, str):
        raise _FormatError(f"'{key}' is not a string in {json.dumps(entry)[:80]}")
    return value
