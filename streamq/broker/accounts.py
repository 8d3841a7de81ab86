"""The accounts of a broker: users, vhosts and the permissions of users on vhosts.

Owns `<data_dir>/definitions/accounts.json` (format below) and the checks made on the
connection path: `authenticate`, `vhost_access` and `permitted`, each a dict lookup and at
most one precompiled regex.

Rule 1: memory never runs ahead of the disk. A mutator builds the new state, replaces the
file with it (temp file, fsync, rename, fsync directory) and only then swaps it in with a
single assignment, so a failed write changes nothing and readers on another thread see the
old state or the new one, never a mix. Mutators block on fsync: keep them off the event loop.
Rule 2: a file that cannot be read is never replaced. It raises `AccountsCorrupted` and stays
for an operator to repair; without a file, the store holds RabbitMQ's first-start defaults
(vhost "/", user guest/guest tagged administrator with full permissions on "/"), written
with the first change; a first user other than guest (`FirstUser`) is written at once.

It does not know connections (the loopback rule is `users.login_allowed`) nor vhost data
directories (the broker creates and deletes those).

File format, version 1, with the field names of RabbitMQ's definitions export:
    {"version": 1,
     "users": [{"name": "guest", "password_hash": "<base64>",
                "hashing_algorithm": "rabbit_password_hashing_sha256",
                "tags": ["administrator"]}],
     "vhosts": [{"name": "/"}],
     "permissions": [{"user": "guest", "vhost": "/",
                      "configure": ".*", "write": ".*", "read": ".*"}]}
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Final, Literal

from streamq.broker.errors import BrokerError
from streamq.broker.users import (
    DEFAULT_PASSWORD,
    DEFAULT_TAGS,
    DEFAULT_USER,
    HASHING_ALGORITHM,
    NO_PASSWORD,
    User,
    check_password,
    hash_password,
    is_password_hash,
)
from streamq.log import files
from streamq.log.files import fsync_directory, write_file_atomic

ACCOUNTS_DIR: Final = "definitions"
ACCOUNTS_FILE: Final = "accounts.json"
FORMAT_VERSION: Final = 1
DEFAULT_VHOST: Final = "/"
FULL_ACCESS: Final = ".*"
NAME_BYTES_MAX: Final = 255  # user and vhost names travel as AMQP shortstr
TAG_BYTES_MAX: Final = 255
PATTERN_CHARS_MAX: Final = 4096
# RabbitMQ checks the default exchange "" under this name (rabbit_access_control).
DEFAULT_EXCHANGE_ALIAS: Final = "amq.default"

PermissionKind = Literal["configure", "write", "read"]
PERMISSION_KINDS: Final[tuple[PermissionKind, ...]] = ("configure", "write", "read")


class AccountError(BrokerError):
    """Base class of the errors of user, vhost and permission management."""


class AccountsCorrupted(AccountError):
    """The accounts file cannot be read; it is left as it is."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(
            f"accounts file {path} is unreadable ({reason}); repair it or restore it from "
            "a backup: streamq does not overwrite it"
        )


class AccountValueInvalid(AccountError):
    """A bad user or vhost name, tag, password or permission regex."""


class UserNotFound(AccountError):
    def __init__(self, name: str) -> None:
        super().__init__(f"no user '{name}'")


class UserExists(AccountError):
    def __init__(self, name: str) -> None:
        super().__init__(f"user '{name}' already exists")


class VHostNotFound(AccountError):
    def __init__(self, name: str) -> None:
        super().__init__(f"no vhost '{name}'")


class VHostExists(AccountError):
    def __init__(self, name: str) -> None:
        super().__init__(f"vhost '{name}' already exists")


@dataclass(frozen=True, slots=True)
class Permission:
    """What `user` may do in `vhost`: one regex per kind, "" for nothing."""

    user: str
    vhost: str
    configure: str
    write: str
    read: str


# The compiled regex per kind; None for "", which RabbitMQ turns into a match of nothing.
_Grant = Mapping[str, "re.Pattern[str] | None"]


@dataclass(frozen=True, slots=True)
class _State:
    users: Mapping[str, User]
    vhosts: frozenset[str]
    permissions: Mapping[tuple[str, str], Permission]
    grants: Mapping[tuple[str, str], _Grant]


@dataclass(frozen=True, slots=True)
class FirstUser:
    """The user a fresh data directory starts with: administrator, full permissions on
    "/" (RabbitMQ's `default_user` and `default_pass`, LavinMQ's `default_password_hash`)."""

    name: str
    password_hash: str  # RabbitMQ's sha256 format

    def __post_init__(self) -> None:
        check_name("user", self.name)
        if self.password_hash == NO_PASSWORD:
            raise AccountValueInvalid("the first user needs a password hash")
        check_password_hash(self.password_hash)

    @classmethod
    def guest(cls) -> FirstUser:
        return cls(DEFAULT_USER, hash_password(DEFAULT_PASSWORD))


class AccountStore:
    """Users, vhosts and permissions of one data directory (see the module docstring).

    Readers are safe on any thread. Mutators are serialised by a lock, raise the
    `AccountError` subclasses they name or OSError, and fsync before returning.
    """

    def __init__(self, path: str, state: _State) -> None:
        self.path = path
        self._state = state
        self._lock = threading.Lock()
        # Bumped after every change is in use: caches of answers (a connection's
        # `Permissions`) compare it to drop what they hold once anything changed.
        self.generation = 0

    @classmethod
    def open(cls, data_dir: str, first_user: FirstUser | None = None) -> AccountStore:
        """Read the accounts of `data_dir`, or the first-start defaults if it has none.

        Without a file, the defaults' user is `first_user` if given (the operator's
        `default_user`), and the file is written at once (fsynced) so that this user stays
        the first one whatever the next start is given; else it is guest/guest and nothing
        is written. An existing file is never changed here. Raises AccountsCorrupted for a
        file it cannot parse, OSError if the file cannot be read or written.
        """
        path = os.path.join(data_dir, ACCOUNTS_DIR, ACCOUNTS_FILE)
        try:
            with open(path, "rb") as file:
                data = file.read()
        except FileNotFoundError:
            if first_user is None:
                return cls(path, _default_state(FirstUser.guest()))
            store = cls(path, _default_state(first_user))
            store._commit(store._state)
            return store
        return cls(path, _decode(path, data))

    # Users.

    def user(self, name: str) -> User | None:
        return self._state.users.get(name)

    def list_users(self) -> list[User]:
        return sorted(self._state.users.values(), key=lambda user: user.name)

    def authenticate(self, username: str, password: str) -> User | None:
        """The user if the password is right; None otherwise (without saying which part)."""
        user = self._state.users.get(username)
        if user is None or not check_password(password, user.password_hash):
            return None
        return user

    def add_user(self, name: str, password: str, tags: Iterable[str] = ()) -> User:
        """Add a user, with no permissions. Fsyncs file and directory before returning.

        Raises UserExists, AccountValueInvalid.
        """
        user = User(check_name("user", name), _hash(password), check_tags(tags))
        with self._lock:
            state = self._state
            if name in state.users:
                raise UserExists(name)
            self._commit(replace(state, users={**state.users, name: user}))
        return user

    def delete_user(self, name: str) -> None:
        """Delete a user and its permissions. Fsyncs file and directory before returning.

        Raises UserNotFound.
        """
        with self._lock:
            state = self._state
            _require_user(state, name)
            users = {key: user for key, user in state.users.items() if key != name}
            self._commit(_with_permissions(replace(state, users=users), lambda p: p.user != name))

    def change_password(self, name: str, password: str) -> None:
        """Fsyncs file and directory before returning. Raises UserNotFound, AccountValueInvalid."""
        self._update_user(name, password_hash=_hash(password))

    def clear_password(self, name: str) -> None:
        """Make password logins of the user fail. Fsyncs file and directory before returning.

        Raises UserNotFound.
        """
        self._update_user(name, password_hash=NO_PASSWORD)

    def set_user_tags(self, name: str, tags: Iterable[str]) -> None:
        """Replace the user's tags. Fsyncs file and directory before returning.

        Raises UserNotFound, AccountValueInvalid.
        """
        self._update_user(name, tags=check_tags(tags))

    def put_user(self, name: str, password_hash: str, tags: Iterable[str]) -> bool:
        """Create the user or replace its password hash and tags (RabbitMQ's PUT
        /api/users/{name}); returns whether it was created. `password_hash` is a
        `rabbit_password_hashing_sha256` hash, or NO_PASSWORD. Fsyncs file and directory
        before returning. Raises AccountValueInvalid.
        """
        user = User(check_name("user", name), check_password_hash(password_hash), check_tags(tags))
        with self._lock:
            state = self._state
            self._commit(replace(state, users={**state.users, name: user}))
        return name not in state.users

    def delete_users(self, names: Iterable[str]) -> list[str]:
        """Delete the users that exist and their permissions, in one change; returns the
        names that did not exist. Fsyncs file and directory before returning."""
        wanted = set(names)
        with self._lock:
            state = self._state
            users = {key: user for key, user in state.users.items() if key not in wanted}
            if len(users) != len(state.users):
                trimmed = _with_permissions(replace(state, users=users), lambda p: p.user in users)
                self._commit(trimmed)
        return sorted(wanted.difference(state.users))

    def merge(self, users: Iterable[User], permissions: Iterable[Permission]) -> None:
        """Add or replace `users` and `permissions` in one change (a definitions import:
        doing it twice changes nothing the second time). Fsyncs file and directory before
        returning. Raises AccountValueInvalid, UserNotFound, VHostNotFound.
        """
        added = {
            check_name("user", u.name): User(
                u.name, check_password_hash(u.password_hash), check_tags(u.tags)
            )
            for u in users
        }
        granted = {(p.user, p.vhost): (p, _compile(p)) for p in permissions}
        with self._lock:
            state = self._state
            merged = replace(state, users={**state.users, **added})
            for user, vhost in granted:
                _require_user(merged, user)
                _require_vhost(merged, vhost)
            merged = replace(
                merged,
                permissions={**state.permissions, **{k: p for k, (p, _) in granted.items()}},
                grants={**state.grants, **{k: g for k, (_, g) in granted.items()}},
            )
            if merged != state:
                self._commit(merged)

    def _update_user(
        self, name: str, *, password_hash: str | None = None, tags: tuple[str, ...] | None = None
    ) -> None:
        with self._lock:
            state = self._state
            user = _require_user(state, name)
            if password_hash is not None:
                user = replace(user, password_hash=password_hash)
            if tags is not None:
                user = replace(user, tags=tags)
            self._commit(replace(state, users={**state.users, name: user}))

    # Vhosts.

    def has_vhost(self, name: str) -> bool:
        return name in self._state.vhosts

    def list_vhosts(self) -> list[str]:
        return sorted(self._state.vhosts)

    def add_vhost(self, name: str) -> None:
        """Fsyncs file and directory before returning. Raises VHostExists, AccountValueInvalid."""
        check_name("vhost", name)
        with self._lock:
            state = self._state
            if name in state.vhosts:
                raise VHostExists(name)
            self._commit(replace(state, vhosts=state.vhosts | {name}))

    def delete_vhost(self, name: str) -> None:
        """Delete a vhost's definition and the permissions on it (not its data directory).

        Fsyncs file and directory before returning. Raises VHostNotFound.
        """
        with self._lock:
            state = self._state
            _require_vhost(state, name)
            vhosts = state.vhosts - {name}
            self._commit(
                _with_permissions(replace(state, vhosts=vhosts), lambda p: p.vhost != name)
            )

    # Permissions.

    def permissions(self, user: str, vhost: str) -> Permission | None:
        return self._state.permissions.get((user, vhost))

    def list_permissions(
        self, *, vhost: str | None = None, user: str | None = None
    ) -> list[Permission]:
        """The permissions on `vhost` and/or of `user` (all without either), sorted.

        Raises VHostNotFound, UserNotFound for a name given that does not exist.
        """
        state = self._state
        if vhost is not None:
            _require_vhost(state, vhost)
        if user is not None:
            _require_user(state, user)
        found = [
            permission
            for permission in state.permissions.values()
            if vhost in (None, permission.vhost) and user in (None, permission.user)
        ]
        return sorted(found, key=lambda permission: (permission.vhost, permission.user))

    def set_permissions(
        self, user: str, vhost: str, configure: str, write: str, read: str
    ) -> Permission:
        """Set (replace) what `user` may do in `vhost`; each argument is a regex, "" for none.

        Fsyncs file and directory before returning. Raises UserNotFound, VHostNotFound,
        AccountValueInvalid for a regex that does not compile.
        """
        permission = Permission(user, vhost, configure, write, read)
        grant = _compile(permission)
        with self._lock:
            state = self._state
            _require_user(state, user)
            _require_vhost(state, vhost)
            key = (user, vhost)
            permissions = {**state.permissions, key: permission}
            self._commit(
                replace(state, permissions=permissions, grants={**state.grants, key: grant})
            )
        return permission

    def clear_permissions(self, user: str, vhost: str) -> None:
        """Remove what `user` may do in `vhost` (nothing to do if it had no permissions).

        Fsyncs file and directory before returning. Raises UserNotFound, VHostNotFound.
        """
        with self._lock:
            state = self._state
            _require_user(state, user)
            _require_vhost(state, vhost)
            if (user, vhost) in state.permissions:
                self._commit(_with_permissions(state, lambda p: (p.user, p.vhost) != (user, vhost)))

    def vhost_access(self, user: str, vhost: str) -> bool:
        """RabbitMQ's rule: a user may open a vhost iff it has permissions on it."""
        return (user, vhost) in self._state.grants

    def permitted(self, user: str, vhost: str, kind: PermissionKind, resource: str) -> bool:
        """Whether `user` may `kind` the exchange or queue `resource` in `vhost`.

        As RabbitMQ (`rabbit_auth_backend_internal:check_resource_access`), the regex is
        searched in the name, not matched in full: anchor it with ^...$ to match exactly.
        The default exchange "" is checked as "amq.default".
        """
        grant = self._state.grants.get((user, vhost))
        if grant is None:
            return False
        pattern = grant[kind]
        return (
            pattern is not None and pattern.search(resource or DEFAULT_EXCHANGE_ALIAS) is not None
        )

    def _commit(self, state: _State) -> None:
        """Replace the file with `state`, then use it; fsyncs file and directory first."""
        directory = os.path.dirname(self.path)
        if not os.path.isdir(directory):
            files.makedirs(directory)
            fsync_directory(os.path.dirname(directory))
        write_file_atomic(self.path, _encode(state), fsync_dir=True)
        self._state = state
        self.generation += 1  # after the state: a reader that sees it sees the new state


# Validation, shared by the mutators and the file reader.


def check_name(what: str, name: str) -> str:
    """`name` if it is a valid user or vhost name; raises AccountValueInvalid otherwise."""
    if not name:
        raise AccountValueInvalid(f"{what} name must not be empty")
    size = len(_utf8(f"{what} name", name))
    if size > NAME_BYTES_MAX:
        raise AccountValueInvalid(f"{what} name is {size} bytes, longer than {NAME_BYTES_MAX}")
    return name


def check_tags(tags: Iterable[str]) -> tuple[str, ...]:
    """The tags, split at commas as RabbitMQ's HTTP API does, stripped and without repeats."""
    found: dict[str, None] = {}
    for text in tags:
        for tag in (part.strip() for part in text.split(",")):
            if len(_utf8("tag", tag)) > TAG_BYTES_MAX:
                raise AccountValueInvalid(
                    f"tag '{tag[:40]}...' is longer than {TAG_BYTES_MAX} bytes"
                )
            if tag:
                found[tag] = None
    return tuple(found)


def check_password_hash(password_hash: str) -> str:
    """`password_hash` if it is a sha256 hash (or NO_PASSWORD); AccountValueInvalid otherwise."""
    if not is_password_hash(password_hash):
        raise AccountValueInvalid(
            "password_hash is not a rabbit_password_hashing_sha256 hash "
            "(base64 of a 4-byte salt and a 32-byte digest)"
        )
    return password_hash


def _hash(password: str) -> str:
    _utf8("password", password)
    return hash_password(password)


def _utf8(what: str, text: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError:
        raise AccountValueInvalid(f"{what} is not valid UTF-8") from None


def _compile(permission: Permission) -> _Grant:
    grant: dict[str, re.Pattern[str] | None] = {}
    for kind in PERMISSION_KINDS:
        regex: str = getattr(permission, kind)
        grant[kind] = _compile_one(kind, regex)
    return grant


def _compile_one(kind: str, regex: str) -> re.Pattern[str] | None:
    if len(regex) > PATTERN_CHARS_MAX:
        raise AccountValueInvalid(f"{kind} regex is longer than {PATTERN_CHARS_MAX} characters")
    if regex == "":
        return None
    _utf8(f"{kind} regex", regex)
    try:
        return re.compile(regex)
    except re.error as exc:
        raise AccountValueInvalid(f"invalid {kind} regex '{regex}': {exc}") from None


def _require_user(state: _State, name: str) -> User:
    user = state.users.get(name)
    if user is None:
        raise UserNotFound(name)
    return user


def _require_vhost(state: _State, name: str) -> None:
    if name not in state.vhosts:
        raise VHostNotFound(name)


def _with_permissions(state: _State, keep: Callable[[Permission], bool]) -> _State:
    """`state` with only the permissions `keep` accepts."""
    permissions = {key: value for key, value in state.permissions.items() if keep(value)}
    grants = {key: state.grants[key] for key in permissions}
    return replace(state, permissions=permissions, grants=grants)


def _make_state(
    users: Iterable[User], vhosts: Iterable[str], permissions: Iterable[Permission]
) -> _State:
    by_key = {(permission.user, permission.vhost): permission for permission in permissions}
    grants = {key: _compile(permission) for key, permission in by_key.items()}
    return _State({user.name: user for user in users}, frozenset(vhosts), by_key, grants)


def _default_state(first_user: FirstUser) -> _State:
    user = User(first_user.name, first_user.password_hash, DEFAULT_TAGS)
    full = Permission(first_user.name, DEFAULT_VHOST, FULL_ACCESS, FULL_ACCESS, FULL_ACCESS)
    return _make_state([user], [DEFAULT_VHOST], [full])


# The file format (see the module docstring).


def _encode(state: _State) -> bytes:
    users = [
        {
            "name": user.name,
            "password_hash": user.password_hash,
            "hashing_algorithm": HASHING_ALGORITHM,
            "tags": list(user.tags),
        }
        for user in sorted(state.users.values(), key=lambda user: user.name)
    ]
    permissions = [
        {
            "user": p.user,
            "vhost": p.vhost,
            "configure": p.configure,
            "write": p.write,
            "read": p.read,
        }
        for p in sorted(state.permissions.values(), key=lambda p: (p.vhost, p.user))
    ]
    document = {
        "version": FORMAT_VERSION,
        "users": users,
        "vhosts": [{"name": name} for name in sorted(state.vhosts)],
        "permissions": permissions,
    }
    return (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode()


class _FormatError(Exception):
    """A reason the accounts file cannot be read; becomes AccountsCorrupted."""


def _decode(path: str, data: bytes) -> _State:
    """The state in `data`; raises AccountsCorrupted naming `path` if it is not valid."""
    try:
        document = _object(json.loads(data.decode("utf-8")), "the document")
        version = document.get("version")
        if type(version) is not int or version != FORMAT_VERSION:
            raise _FormatError(f"version {version!r}, this streamq reads {FORMAT_VERSION}")
        users = [_decode_user(entry) for entry in _array(document, "users")]
        vhosts = [
            check_name("vhost", _string(entry, "name")) for entry in _array(document, "vhosts")
        ]
        permissions = [_decode_permission(entry) for entry in _array(document, "permissions")]
        _check_references(users, vhosts, permissions)
        return _make_state(users, vhosts, permissions)
    except (ValueError, _FormatError, AccountValueInvalid) as exc:  # JSONDecodeError, UnicodeError
        raise AccountsCorrupted(path, str(exc)) from None


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


def _decode_permission(entry: object) -> Permission:
    user, vhost = _string(entry, "user"), _string(entry, "vhost")
    regexes = [_string(entry, kind) for kind in PERMISSION_KINDS]
    return Permission(user, vhost, *regexes)


def _check_references(users: list[User], vhosts: list[str], permissions: list[Permission]) -> None:
    names = {user.name for user in users}
    if len(names) != len(users) or len(set(vhosts)) != len(vhosts):
        raise _FormatError("a user or vhost is listed twice")
    if len({(p.user, p.vhost) for p in permissions}) != len(permissions):
        raise _FormatError("permissions of a user on a vhost are listed twice")
    for p in permissions:
        if p.user not in names or p.vhost not in vhosts:
            raise _FormatError(f"permissions of unknown user '{p.user}' or vhost '{p.vhost}'")


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
