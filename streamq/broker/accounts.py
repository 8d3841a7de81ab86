"""The accounts of a broker: users, vhosts (and their metadata), the permissions of users
on vhosts and their topic permissions on exchanges, and vhost and user limits.

Owns `<data_dir>/definitions/accounts.json` (its format is streamq/broker/accounts_file.py)
and the checks made on the connection path: `authenticate`, `vhost_access`, `permitted`,
`topic_grants`, `vhost_limit` and `user_limit`, each a dict lookup or two and at most one
precompiled regex. The state and its pure changes are streamq/broker/account_state.py's.

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
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Final

from streamq.broker import account_limits, account_state, accounts_file
from streamq.broker.account_limits import Limits
from streamq.broker.account_state import (
    State,
    check_topic_permission,
    compile_grant,
    decode_state,
    encode_state,
    keep_topic_permissions,
    make_state,
    require_user,
    require_vhost,
    scoped,
    with_metadata,
    with_permissions,
    with_topic_permissions,
    with_user_limits,
    with_vhost_limits,
)
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
    hashed,
)
from streamq.broker.topic_permissions import TopicGrants, TopicPermission
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

    def __init__(self, path: str, state: State) -> None:
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
        return cls(path, decode_state(path, data))

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
            require_user(state, name)
            users = {key: user for key, user in state.users.items() if key != name}
            trimmed = with_permissions(replace(state, users=users), lambda p: p.user != name)
            trimmed = with_user_limits(trimmed, name, {})
            self._commit(keep_topic_permissions(trimmed, lambda t: t.user != name))

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
                trimmed = with_permissions(replace(state, users=users), lambda p: p.user in users)
                limits = {k: v for k, v in state.user_limits.items() if k in users}
                trimmed = replace(trimmed, user_limits=limits)
                self._commit(keep_topic_permissions(trimmed, lambda t: t.user in users))
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
        granted = {(p.user, p.vhost): (p, compile_grant(p)) for p in permissions}
        with self._lock:
            state = self._state
            merged = replace(state, users={**state.users, **added})
            for user, vhost in granted:
                require_user(merged, user)
                require_vhost(merged, vhost)
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
            user = require_user(state, name)
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
            self._commit(with_metadata(added, name, metadata))

    def vhost_metadata(self, name: str) -> VHostMetadata:
        """The description, tags and default queue type of vhost `name` (none if unknown)."""
        return self._state.vhost_metadata.get(name, NO_METADATA)

    def set_vhost_metadata(self, name: str, metadata: VHostMetadata) -> None:
        """Replace a vhost's metadata. Fsyncs file and directory before returning (nothing
        to write if unchanged). Raises VHostNotFound, AccountValueInvalid."""
        metadata = check_vhost_metadata(metadata)
        with self._lock:
            state = self._state
            require_vhost(state, name)
            if self.vhost_metadata(name) != metadata:
                self._commit(with_metadata(state, name, metadata))

    def delete_vhost(self, name: str) -> None:
        """Delete a vhost's definition and the permissions and topic permissions on it
        (not its data directory).

        Fsyncs file and directory before returning. Raises VHostNotFound.
        """
        with self._lock:
            state = self._state
            require_vhost(state, name)
            vhosts = state.vhosts - {name}
            without = with_metadata(replace(state, vhosts=vhosts), name, NO_METADATA)
            without = with_vhost_limits(without, name, None)
            trimmed = with_permissions(without, lambda p: p.vhost != name)
            self._commit(keep_topic_permissions(trimmed, lambda t: t.vhost != name))

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
        found = scoped(state, state.permissions.values(), vhost, user)
        return sorted(found, key=lambda permission: (permission.vhost, permission.user))

    def set_permissions(
        self, user: str, vhost: str, configure: str, write: str, read: str
    ) -> Permission:
        """Set (replace) what `user` may do in `vhost`; each argument is a regex, "" for none.

        Fsyncs file and directory before returning. Raises UserNotFound, VHostNotFound,
        AccountValueInvalid for a regex that does not compile.
        """
        permission = Permission(user, vhost, configure, write, read)
        grant = compile_grant(permission)
        with self._lock:
            state = self._state
            require_user(state, user)
            require_vhost(state, vhost)
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
            require_user(state, user)
            require_vhost(state, vhost)
            if (user, vhost) in state.permissions:
                self._commit(with_permissions(state, lambda p: (p.user, p.vhost) != (user, vhost)))

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
        found = scoped(state, state.topic_permissions.values(), vhost, user)
        return sorted(found, key=lambda topic: (topic.vhost, topic.user, topic.exchange))

    def set_topic_permissions(
        self, user: str, vhost: str, exchange: str, write: str, read: str
    ) -> TopicPermission:
        """Set (replace) the routing keys `user` may write and read through `exchange` in
        `vhost`; each a regex, "" for the empty key only. Fsyncs file and directory before
        returning. Raises UserNotFound, VHostNotFound, AccountValueInvalid for a regex that
        does not compile."""
        topic = TopicPermission(user, vhost, exchange, write, read)
        check_topic_permission(topic)
        with self._lock:
            state = self._state
            require_user(state, user)
            require_vhost(state, vhost)
            topics = {**state.topic_permissions, (user, vhost, exchange): topic}
            self._commit(with_topic_permissions(state, topics.values()))
        return topic

    def clear_topic_permissions(self, user: str, vhost: str, exchange: str | None = None) -> None:
        """Remove the topic permissions of `user` in `vhost` on `exchange`, or on every
        exchange without one (nothing to do if there are none). Fsyncs file and directory
        before returning. Raises UserNotFound, VHostNotFound."""
        with self._lock:
            state = self._state
            require_user(state, user)
            require_vhost(state, vhost)
            trimmed = keep_topic_permissions(
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
            check_topic_permission(topic)
        with self._lock:
            state = self._state
            for user, vhost, _ in added:
                require_user(state, user)
                require_vhost(state, vhost)
            merged = with_topic_permissions(state, {**state.topic_permissions, **added}.values())
            if merged != state:
                self._commit(merged)

    # Limits (their names and checks: account_limits.py; their changes: account_state.py).
    # Each mutator fsyncs file and directory before returning (nothing to write if it
    # changes nothing) and raises VHostNotFound or UserNotFound, and LimitInvalid with
    # RabbitMQ's words.

    def vhost_limits(self, vhost: str) -> Limits | None:
        """Vhost `vhost`'s `vhost-limits` parameter; None when it has none."""
        return self._state.vhost_limits.get(vhost)

    def list_vhost_limits(self) -> list[tuple[str, Limits]]:
        return sorted(self._state.vhost_limits.items())

    def vhost_limit(self, vhost: str, name: str) -> int | None:
        """The limit `name` in force on `vhost` (None: none); a dict lookup or two."""
        return account_limits.limit_of(self._state.vhost_limits.get(vhost), name)

    def set_vhost_limits(self, vhost: str, limits: object) -> None:
        """Replace the whole `vhost-limits` parameter with `limits` (a JSON object, [] for
        none; None removes it), as `rabbitmqctl set_vhost_limits` and imports do."""
        checked = None if limits is None else account_limits.check_vhost_limits(limits)
        self._change(lambda state: account_state.vhost_limits_set(state, vhost, checked))

    def update_vhost_limit(self, vhost: str, name: str, value: object) -> None:
        """Set one limit, keeping the others (RabbitMQ's `update_limit`, the API's PUT)."""
        self._change(lambda state: account_state.vhost_limit_updated(state, vhost, name, value))

    def clear_vhost_limit(self, vhost: str, name: str) -> None:
        """Remove one limit (RabbitMQ's `clear_limit`: the parameter stays, maybe empty)."""
        self._change(lambda state: account_state.vhost_limit_cleared(state, vhost, name))

    def user_limits(self, user: str) -> Limits:
        """User `user`'s limits (empty when none or no such user)."""
        return self._state.user_limits.get(user, {})

    def list_user_limits(self) -> list[tuple[str, Limits]]:
        return sorted(self._state.user_limits.items())

    def user_limit(self, user: str, name: str) -> int | None:
        """The limit `name` in force for `user` (None: none); a dict lookup or two."""
        return account_limits.limit_of(self._state.user_limits.get(user), name)

    def set_user_limits(self, user: str, limits: object) -> None:
        """Add or replace the limits in `limits`, keeping the user's others (RabbitMQ's
        `set_user_limits`)."""
        checked = account_limits.check_user_limits(limits)
        self._change(lambda state: account_state.user_limits_added(state, user, checked))

    def clear_user_limit(self, user: str, name: str) -> None:
        """Remove limit `name`, or every one for "all" (RabbitMQ's `clear_user_limits`)."""
        self._change(lambda state: account_state.user_limit_cleared(state, user, name))

    def merge_limits(
        self, vhost_limits: Iterable[tuple[str, object]], user_limits: Iterable[tuple[str, object]]
    ) -> None:
        """Replace vhosts' `vhost-limits` parameters and add users' limits in one change
        (a definitions import)."""
        vhosts = [(v, account_limits.check_vhost_limits(found)) for v, found in vhost_limits]
        users = [(u, account_limits.check_user_limits(found)) for u, found in user_limits]
        self._change(lambda state: account_state.limits_merged(state, vhosts, users))

    def _change(self, change: Callable[[State], State]) -> None:
        """Apply the pure `change` to the state under the lock; commit what it changed."""
        with self._lock:
            state = self._state
            changed = change(state)
            if changed != state:
                self._commit(changed)

    def _commit(self, state: State) -> None:
        """Replace the file with `state`, then use it; fsyncs file and directory first."""
        directory = os.path.dirname(self.path)
        if not os.path.isdir(directory):
            files.makedirs(directory)
            fsync_directory(os.path.dirname(directory))
        write_file_atomic(self.path, encode_state(state), fsync_dir=True)
        self._state = state
        self.generation += 1  # after the state: a reader that sees it sees the new state


def _default_state(first_user: FirstUser) -> State:
    user = User(first_user.name, first_user.password_hash, DEFAULT_TAGS)
    full = Permission(first_user.name, DEFAULT_VHOST, FULL_ACCESS, FULL_ACCESS, FULL_ACCESS)
    return make_state([user], [DEFAULT_VHOST], [full])
