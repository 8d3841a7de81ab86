"""The values of the accounts: the errors of their management, the permission record,
and when a user or vhost name, a tag, a password hash or a permission regex is valid.

Shared by the store (streamq/broker/accounts.py), its file format
(streamq/broker/accounts_file.py) and definitions imports; pure functions, no state, no
I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Literal

from streamq.broker.errors import BrokerError
from streamq.broker.users import hash_password, is_password_hash

NAME_BYTES_MAX: Final = 255  # user and vhost names travel as AMQP shortstr
TAG_BYTES_MAX: Final = 255
PATTERN_CHARS_MAX: Final = 4096

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


def check_name(what: str, name: str) -> str:
    """`name` if it is a valid user or vhost name; raises AccountValueInvalid otherwise."""
    if not name:
        raise AccountValueInvalid(f"{what} name must not be empty")
    size = len(utf8(f"{what} name", name))
    if size > NAME_BYTES_MAX:
        raise AccountValueInvalid(f"{what} name is {size} bytes, longer than {NAME_BYTES_MAX}")
    return name


def check_tags(tags: Iterable[str]) -> tuple[str, ...]:
    """The tags, split at commas as RabbitMQ's HTTP API does, stripped and without repeats."""
    found: dict[str, None] = {}
    for text in tags:
        for tag in (part.strip() for part in text.split(",")):
            if len(utf8("tag", tag)) > TAG_BYTES_MAX:
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


def hashed(password: str) -> str:
    utf8("password", password)
    return hash_password(password)


def utf8(what: str, text: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError:
        raise AccountValueInvalid(f"{what} is not valid UTF-8") from None


def compile_regex(kind: str, regex: str) -> re.Pattern[str] | None:
    """The compiled `regex` of a permission of `kind`, None for ""; raises
    AccountValueInvalid if it is too long, not UTF-8 or does not compile."""
    if len(regex) > PATTERN_CHARS_MAX:
        raise AccountValueInvalid(f"{kind} regex is longer than {PATTERN_CHARS_MAX} characters")
    if regex == "":
        return None
    utf8(f"{kind} regex", regex)
    try:
        return re.compile(regex)
    except re.error as exc:
        raise AccountValueInvalid(f"invalid {kind} regex '{regex}': {exc}") from None
