"""The accounts of a broker: users, vhosts (and their metadata), the permissions of users
on vhosts and their topic permissions on exchanges.

Owns `<data_dir>/definitions/accounts.json` (its format is streamq/broker/accounts_file.py)
and the checks made on the connection path: `authenticate`, `vhost_access`, `permitted`
and `topic_grants`, each a dict lookup and at most one precompiled regex.

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
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Final, TypeVar

from streamq.broker import accounts_file
from streamq.broker.account_values import (
    NAME_BYTES_MAX,
    NO_METADATA,
    PATTERN_CHARS_MAX,
    PERMISSION_KINDS,
    TAG_BYTES_MAX,
    AccountError,
    AccountsCorrupted,
    AccountValueInvalid,
    Permission,
    PermissionKind,
    UserExists,
    UserNotFound,
    VHostExists,
    VHostMetadata,
    VHostNotFound,
    check_name,
    check_password_hash,
    check_tags,
    check_vhost_metadata,
    compile_regex,
    hashed,
    utf8,
)
from streamq.broker.topic_permissions import TOPIC_KINDS, TopicGrants, TopicPermission
from streamq.broker.users import (
    DEFAULT_PASSWORD,
    DEFAULT_TAGS,
    DEFAULT_USER,
    NO_PASSWORD,
    User,
    check_password,
    hash_password,
)
from streamq.log import files
from streamq.log.files import fsync_directory, write_file_atomic

__all__ = [  # the names other modules take from here, defined in account_values
    "NAME_BYTES_MAX",
    "PATTERN_CHARS_MAX",
    "PERMISSION_KINDS",
    "TAG_BYTES_MAX",
    "AccountError",
    "AccountStore",
    "AccountValueInvalid",
    "AccountsCorrupted",
    "FirstUser",
    "Permission",
    "PermissionKind",
    "TopicPermission",
    "UserExists",
    "UserNotFound",
    "VHostExists",
    "VHostMetadata",
    "VHostNotFound",
    "check_name",
    "check_password_hash",
    "check_tags",
]

ACCOUNTS_DIR: Final = "definitions"
ACCOUNTS_FILE: Final = "accounts.json"
FORMAT_VERSION: Final = accounts_file.FORMAT_VERSION
DEFAULT_VHOST: Final = "/"
FULL_ACCESS: Final = ".*"
# RabbitMQ checks the default exchange "" under this name (rabbit_access_control).
DEFAULT_EXCHANGE_ALIAS: Final = "amq.default"

# The compiled regex per kind; None for "", which RabbitMQ turns into a match of nothing.
_Grant = Mapping[str, "re.Pattern[str] | None"]


@dataclass(frozen=True, slots=True)
class _State:
    users: Mapping[str, User]
    vhosts: frozenset[str]
    permissions: Mapping[tuple[str, str], Permission]
    grants: Mapping[tuple[str, str], _Grant]
    # By (user, vhost, exchange); their grants by (user, vhost), only for pairs with some.
    topic_permissions: Mapping[tuple[str, str, str], TopicPermission] = field(default_factory=dict)
    topic_grants: Mapping[tuple[str, str], TopicGrants] = field(default_factory=dict)
    vhost_metadata: Mapping[str, VHostMetadata] = field(default_factory=dict)  # if not none


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
        user = User(check_name("user", name), hashed(password), check_tags(tags))
        with self._lock:
            state = self._state
            if name in state.users:
                raise UserExists(name)
            self._commit(replace(state, users={**state.users, name: user}))
        return user

    def delete_user(self, name: str) -> None:
        """Delete a user and its permissions, topic ones included. Fsyncs file and
        directory before returning.

        Raises UserNotFound.
        """
        with self._lock:
            state = self._state
            _require_user(state, name)
            users = {key: user for key, user in state.users.items() if key != name}
            trimmed = _with_permissions(replace(state, users=users), lambda p: p.user != name)
            self._commit(_keep_topic_permissions(trimmed, lambda t: t.user != name))

    def change_password(self, name: str, password: str) -> None:
        """Fsyncs file and directory before returning. Raises UserNotFound, AccountValueInvalid."""
        self._update_user(name, password_hash=hashed(password))

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
                self._commit(_keep_topic_permissions(trimmed, lambda t: t.user in users))
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

    def add_vhost(self, name: str, metadata: VHostMetadata = NO_METADATA) -> None:
        """Fsyncs file and directory before returning. Raises VHostExists, AccountValueInvalid."""
        check_name("vhost", name)
        metadata = check_vhost_metadata(metadata)
        with self._lock:
            state = self._state
            if name in state.vhosts:
                raise VHostExists(name)
            added = replace(state, vhosts=state.vhosts | {name})
            self._commit(_with_metadata(added, name, metadata))

    def vhost_metadata(self, name: str) -> VHostMetadata:
        """The description, tags and default queue type of vhost `name` (none if unknown)."""
        return self._state.vhost_metadata.get(name, NO_METADATA)

    def set_vhost_metadata(self, name: str, metadata: VHostMetadata) -> None:
        """Replace a vhost's metadata. Fsyncs file and directory before returning (nothing
        to write if unchanged). Raises VHostNotFound, AccountValueInvalid."""
        metadata = check_vhost_metadata(metadata)
        with self._lock:
            state = self._state
            _require_vhost(state, name)
            if self.vhost_metadata(name) != metadata:
                self._commit(_with_metadata(state, name, metadata))

    def delete_vhost(self, name: str) -> None:
        """Delete a vhost's definition and the permissions and topic permissions on it
        (not its data directory).

        Fsyncs file and directory before returning. Raises VHostNotFound.
        """
        with self._lock:
            state = self._state
            _require_vhost(state, name)
            vhosts = state.vhosts - {name}
            without = _with_metadata(replace(state, vhosts=vhosts), name, NO_METADATA)
            trimmed = _with_permissions(without, lambda p: p.vhost != name)
            self._commit(_keep_topic_permissions(trimmed, lambda t: t.vhost != name))

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
        found = _scoped(state, state.permissions.values(), vhost, user)
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

    # Topic permissions.

    def topic_grants(self, user: str, vhost: str) -> TopicGrants | None:
        """The topic permissions of `user` in `vhost`; None when it has none there, so
        that a publish needs no topic check at all."""
        return self._state.topic_grants.get((user, vhost))

    def list_topic_permissions(
        self, *, user: str | None = None, vhost: str | None = None
    ) -> list[TopicPermission]:
        """The topic permissions of `user` and/or on `vhost` (all without either), sorted
        by vhost, user and exchange. Raises UserNotFound, VHostNotFound for a name given
        that does not exist."""
        state = self._state
        found = _scoped(state, state.topic_permissions.values(), vhost, user)
        return sorted(found, key=lambda topic: (topic.vhost, topic.user, topic.exchange))

    def set_topic_permissions(
        self, user: str, vhost: str, exchange: str, write: str, read: str
    ) -> TopicPermission:
        """Set (replace) the routing keys `user` may write and read through `exchange` in
        `vhost`; each a regex, "" for the empty key only. Fsyncs file and directory before
        returning. Raises UserNotFound, VHostNotFound, AccountValueInvalid for a regex that
        does not compile."""
        topic = TopicPermission(user, vhost, exchange, write, read)
        _check_topic_permission(topic)
        with self._lock:
            state = self._state
            _require_user(state, user)
            _require_vhost(state, vhost)
            topics = {**state.topic_permissions, (user, vhost, exchange): topic}
            self._commit(_with_topic_permissions(state, topics.values()))
        return topic

    def clear_topic_permissions(self, user: str, vhost: str, exchange: str | None = None) -> None:
        """Remove the topic permissions of `user` in `vhost` on `exchange`, or on every
        exchange without one (nothing to do if there are none). Fsyncs file and directory
        before returning. Raises UserNotFound, VHostNotFound."""
        with self._lock:
            state = self._state
            _require_user(state, user)
            _require_vhost(state, vhost)
            trimmed = _keep_topic_permissions(
                state,
                lambda t: (t.user, t.vhost) != (user, vhost) or exchange not in (None, t.exchange),
            )
            if trimmed != state:
                self._commit(trimmed)

    def merge_topic_permissions(self, topics: Iterable[TopicPermission]) -> None:
        """Add or replace `topics` in one change (a definitions import). Fsyncs file and
        directory before returning. Raises AccountValueInvalid, UserNotFound, VHostNotFound."""
        added = {(t.user, t.vhost, t.exchange): t for t in topics}
        for topic in added.values():
            _check_topic_permission(topic)
        with self._lock:
            state = self._state
            for user, vhost, _ in added:
                _require_user(state, user)
                _require_vhost(state, vhost)
            merged = _with_topic_permissions(state, {**state.topic_permissions, **added}.values())
            if merged != state:
                self._commit(merged)

    def _commit(self, state: _State) -> None:
        """Replace the file with `state`, then use it; fsyncs file and directory first."""
        directory = os.path.dirname(self.path)
        if not os.path.isdir(directory):
            files.makedirs(directory)
            fsync_directory(os.path.dirname(directory))
        write_file_atomic(self.path, _encode(state), fsync_dir=True)
        self._state = state
        self.generation += 1  # after the state: a reader that sees it sees the new state


def _compile(permission: Permission) -> _Grant:
    grant: dict[str, re.Pattern[str] | None] = {}
    for kind in PERMISSION_KINDS:
        regex: str = getattr(permission, kind)
        grant[kind] = compile_regex(kind, regex)
    return grant


def _require_user(state: _State, name: str) -> User:
    user = state.users.get(name)
    if user is None:
        raise UserNotFound(name)
    return user


def _require_vhost(state: _State, name: str) -> None:
    if name not in state.vhosts:
        raise VHostNotFound(name)


_Scoped = TypeVar("_Scoped", Permission, TopicPermission)


def _scoped(
    state: _State, entries: Iterable[_Scoped], vhost: str | None, user: str | None
) -> list[_Scoped]:
    """Those of `entries` on `vhost` and/or of `user` (all without either). Raises
    VHostNotFound, UserNotFound for a name given that does not exist."""
    if vhost is not None:
        _require_vhost(state, vhost)
    if user is not None:
        _require_user(state, user)
    return [
        entry for entry in entries if vhost in (None, entry.vhost) and user in (None, entry.user)
    ]


def _with_metadata(state: _State, name: str, metadata: VHostMetadata) -> _State:
    """`state` with vhost `name`'s metadata set (kept only when not empty)."""
    kept = {key: value for key, value in state.vhost_metadata.items() if key != name}
    if metadata != NO_METADATA:
        kept[name] = metadata
    return replace(state, vhost_metadata=kept)


def _with_permissions(state: _State, keep: Callable[[Permission], bool]) -> _State:
    """`state` with only the permissions `keep` accepts."""
    permissions = {key: value for key, value in state.permissions.items() if keep(value)}
    grants = {key: state.grants[key] for key in permissions}
    return replace(state, permissions=permissions, grants=grants)


def _keep_topic_permissions(state: _State, keep: Callable[[TopicPermission], bool]) -> _State:
    """`state` with only the topic permissions `keep` accepts."""
    return _with_topic_permissions(state, filter(keep, state.topic_permissions.values()))


def _with_topic_permissions(state: _State, topics: Iterable[TopicPermission]) -> _State:
    """`state` with exactly `topics` as its topic permissions, their grants rebuilt."""
    by_key = {(t.user, t.vhost, t.exchange): t for t in topics}
    by_pair: dict[tuple[str, str], list[TopicPermission]] = {}
    for topic in by_key.values():
        by_pair.setdefault((topic.user, topic.vhost), []).append(topic)
    grants = {pair: TopicGrants(found) for pair, found in by_pair.items()}
    return replace(state, topic_permissions=by_key, topic_grants=grants)


def _check_topic_permission(topic: TopicPermission) -> None:
    """Raises AccountValueInvalid for a regex that does not compile or an exchange name
    that is not a valid shortstr."""
    if len(utf8("exchange name", topic.exchange)) > NAME_BYTES_MAX:
        raise AccountValueInvalid(f"exchange name is longer than {NAME_BYTES_MAX} bytes")
    for kind in TOPIC_KINDS:
        compile_regex(kind, getattr(topic, kind))


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


def _decode(path: str, data: bytes) -> _State:
    """The state in `data`; raises AccountsCorrupted naming `path` if it is not valid."""
    record = accounts_file.decode(path, data)
    state = _make_state(record.users, record.vhosts, record.permissions)
    state = replace(state, vhost_metadata=record.vhost_metadata)
    return _with_topic_permissions(state, record.topic_permissions)


def _encode(state: _State) -> bytes:
    record = accounts_file.AccountsRecord(
        list(state.users.values()),
        list(state.vhosts),
        list(state.permissions.values()),
        list(state.topic_permissions.values()),
        dict(state.vhost_metadata),
    )
    return accounts_file.encode(record)
