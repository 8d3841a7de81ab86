"""The accounts' state: one immutable snapshot of users, vhosts, permissions, topic
permissions, vhost metadata and limits, and the pure functions that build the next one.

Owned here so that the store (streamq/broker/accounts.py) keeps only its lock, its file and
its mutators: each mutator builds a new `State` with these functions, writes it, then
swaps it in with one assignment. Nothing here does I/O, locks or keeps state; the file's
bytes are accounts_file.py's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from streamq.broker import account_limits, accounts_file
from streamq.broker.account_limits import Limits
from streamq.broker.account_values import (
    NAME_BYTES_MAX,
    NO_METADATA,
    PERMISSION_KINDS,
    AccountValueInvalid,
    Permission,
    UserNotFound,
    VHostMetadata,
    VHostNotFound,
    compile_regex,
    utf8,
)
from streamq.broker.topic_permissions import TOPIC_KINDS, TopicGrants, TopicPermission
from streamq.broker.users import User

# The compiled regex per kind; None for "", which RabbitMQ turns into a match of nothing.
Grant = Mapping[str, "re.Pattern[str] | None"]


@dataclass(frozen=True, slots=True)
class State:
    users: Mapping[str, User]
    vhosts: frozenset[str]
    permissions: Mapping[tuple[str, str], Permission]
    grants: Mapping[tuple[str, str], Grant]
    # By (user, vhost, exchange); their grants by (user, vhost), only for pairs with some.
    topic_permissions: Mapping[tuple[str, str, str], TopicPermission] = field(default_factory=dict)
    topic_grants: Mapping[tuple[str, str], TopicGrants] = field(default_factory=dict)
    vhost_metadata: Mapping[str, VHostMetadata] = field(default_factory=dict)  # if not none
    # A vhost's `vhost-limits` parameter, for vhosts that have one (possibly empty, once
    # its last limit is cleared); a user's limits, for users with some.
    vhost_limits: Mapping[str, Limits] = field(default_factory=dict)
    user_limits: Mapping[str, Limits] = field(default_factory=dict)


def compile_grant(permission: Permission) -> Grant:
    grant: dict[str, re.Pattern[str] | None] = {}
    for kind in PERMISSION_KINDS:
        regex: str = getattr(permission, kind)
        grant[kind] = compile_regex(kind, regex)
    return grant


def require_user(state: State, name: str) -> User:
    user = state.users.get(name)
    if user is None:
        raise UserNotFound(name)
    return user


def require_vhost(state: State, name: str) -> None:
    if name not in state.vhosts:
        raise VHostNotFound(name)


Scoped = TypeVar("Scoped", Permission, TopicPermission)


def scoped(
    state: State, entries: Iterable[Scoped], vhost: str | None, user: str | None
) -> list[Scoped]:
    """Those of `entries` on `vhost` and/or of `user` (all without either). Raises
    VHostNotFound, UserNotFound for a name given that does not exist."""
    if vhost is not None:
        require_vhost(state, vhost)
    if user is not None:
        require_user(state, user)
    return [
        entry for entry in entries if vhost in (None, entry.vhost) and user in (None, entry.user)
    ]


def with_metadata(state: State, name: str, metadata: VHostMetadata) -> State:
    """`state` with vhost `name`'s metadata set (kept only when not empty)."""
    kept = {key: value for key, value in state.vhost_metadata.items() if key != name}
    if metadata != NO_METADATA:
        kept[name] = metadata
    return replace(state, vhost_metadata=kept)


def with_vhost_limits(state: State, name: str, limits: Limits | None) -> State:
    """`state` with vhost `name`'s `vhost-limits` parameter set (None: it has none)."""
    kept = {key: value for key, value in state.vhost_limits.items() if key != name}
    if limits is not None:
        kept[name] = dict(limits)
    return replace(state, vhost_limits=kept)


def with_user_limits(state: State, name: str, limits: Limits) -> State:
    """`state` with user `name`'s limits (kept only when not empty)."""
    kept = {key: value for key, value in state.user_limits.items() if key != name}
    if limits:
        kept[name] = dict(limits)
    return replace(state, user_limits=kept)


def vhost_limits_set(state: State, vhost: str, limits: Limits | None) -> State:
    """`state` with vhost `vhost`'s whole `vhost-limits` parameter `limits` (checked).
    Raises VHostNotFound."""
    require_vhost(state, vhost)
    return with_vhost_limits(state, vhost, limits)


def vhost_limit_updated(state: State, vhost: str, name: str, value: object) -> State:
    """`state` with one limit of `vhost` set, first (as RabbitMQ's update_limit conses it
    on, the listing order). Raises VHostNotFound, LimitInvalid."""
    require_vhost(state, vhost)
    current = state.vhost_limits.get(vhost, {})
    wanted = {name: value, **account_limits.without_limit(current, name)}
    return with_vhost_limits(state, vhost, account_limits.check_vhost_limits(wanted))


def vhost_limit_cleared(state: State, vhost: str, name: str) -> State:
    """`state` without one limit of `vhost`; its parameter stays, maybe empty (RabbitMQ's
    clear_limit). Raises VHostNotFound."""
    require_vhost(state, vhost)
    current = state.vhost_limits.get(vhost, {})
    return with_vhost_limits(state, vhost, account_limits.without_limit(current, name))


def user_limits_added(state: State, user: str, limits: Limits) -> State:
    """`state` with `limits` (checked) added to user `user`'s. Raises UserNotFound."""
    require_user(state, user)
    return with_user_limits(state, user, {**state.user_limits.get(user, {}), **limits})


def user_limit_cleared(state: State, user: str, name: str) -> State:
    """`state` without limit `name` of `user`, or every one for "all". Raises UserNotFound."""
    require_user(state, user)
    current = state.user_limits.get(user, {})
    kept = {} if name == account_limits.CLEAR_ALL else account_limits.without_limit(current, name)
    return with_user_limits(state, user, kept)


def limits_merged(
    state: State, vhosts: Sequence[tuple[str, Limits]], users: Sequence[tuple[str, Limits]]
) -> State:
    """`state` with vhosts' parameters replaced and users' limits added (all checked).
    Raises VHostNotFound, UserNotFound."""
    for vhost, limits in vhosts:
        state = vhost_limits_set(state, vhost, limits)
    for user, limits in users:
        state = user_limits_added(state, user, limits)
    return state


def with_permissions(state: State, keep: Callable[[Permission], bool]) -> State:
    """`state` with only the permissions `keep` accepts."""
    permissions = {key: value for key, value in state.permissions.items() if keep(value)}
    grants = {key: state.grants[key] for key in permissions}
    return replace(state, permissions=permissions, grants=grants)


def keep_topic_permissions(state: State, keep: Callable[[TopicPermission], bool]) -> State:
    """`state` with only the topic permissions `keep` accepts."""
    return with_topic_permissions(state, filter(keep, state.topic_permissions.values()))


def with_topic_permissions(state: State, topics: Iterable[TopicPermission]) -> State:
    """`state` with exactly `topics` as its topic permissions, their grants rebuilt."""
    by_key = {(t.user, t.vhost, t.exchange): t for t in topics}
    by_pair: dict[tuple[str, str], list[TopicPermission]] = {}
    for topic in by_key.values():
        by_pair.setdefault((topic.user, topic.vhost), []).append(topic)
    grants = {pair: TopicGrants(found) for pair, found in by_pair.items()}
    return replace(state, topic_permissions=by_key, topic_grants=grants)


def check_topic_permission(topic: TopicPermission) -> None:
    """Raises AccountValueInvalid for a regex that does not compile or an exchange name
    that is not a valid shortstr."""
    if len(utf8("exchange name", topic.exchange)) > NAME_BYTES_MAX:
        raise AccountValueInvalid(f"exchange name is longer than {NAME_BYTES_MAX} bytes")
    for kind in TOPIC_KINDS:
        compile_regex(kind, getattr(topic, kind))


def make_state(
    users: Iterable[User], vhosts: Iterable[str], permissions: Iterable[Permission]
) -> State:
    by_key = {(permission.user, permission.vhost): permission for permission in permissions}
    grants = {key: compile_grant(permission) for key, permission in by_key.items()}
    return State({user.name: user for user in users}, frozenset(vhosts), by_key, grants)


def decode_state(path: str, data: bytes) -> State:
    """The state in `data`; raises AccountsCorrupted naming `path` if it is not valid."""
    record = accounts_file.decode(path, data)
    state = make_state(record.users, record.vhosts, record.permissions)
    state = replace(
        state,
        vhost_metadata=record.vhost_metadata,
        vhost_limits=record.vhost_limits,
        user_limits=record.user_limits,
    )
    return with_topic_permissions(state, record.topic_permissions)


def encode_state(state: State) -> bytes:
    record = accounts_file.AccountsRecord(
        list(state.users.values()),
        list(state.vhosts),
        list(state.permissions.values()),
        list(state.topic_permissions.values()),
        dict(state.vhost_metadata),
        dict(state.vhost_limits),
        dict(state.user_limits),
    )
    return accounts_file.encode(record)
