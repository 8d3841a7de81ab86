"""Users and their passwords, in RabbitMQ's `rabbit_password_hashing_sha256` format.

Owns credential checks: a password hash is base64(salt + sha256(salt + password)) with a
4-byte random salt, so that definitions exported from RabbitMQ keep working. An empty hash
is a cleared password, which no password matches (RabbitMQ's `clear_password`). It does not
know connections; the loopback-only rule for `guest` is applied by its caller, and it does
not store users (`streamq.broker.accounts` does).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from dataclasses import dataclass
from typing import Final

DEFAULT_USER: Final = "guest"
DEFAULT_PASSWORD: Final = "guest"
DEFAULT_TAGS: Final = ("administrator",)
LOOPBACK_USERS: Final = frozenset({"guest"})  # RabbitMQ's loopback_users default
HASHING_ALGORITHM: Final = "rabbit_password_hashing_sha256"
SALT_BYTES: Final = 4
DIGEST_BYTES: Final = 32
NO_PASSWORD: Final = ""  # the hash of a cleared password: no password matches it
# The tags RabbitMQ gives a meaning to; any other string is kept as it is.
KNOWN_TAGS: Final = ("administrator", "monitoring", "management", "policymaker", "impersonator")


def hash_password(password: str, salt: bytes | None = None) -> str:
    """The RabbitMQ sha256 hash of `password`, with a random salt unless one is given.

    Raises UnicodeEncodeError for a password that is not valid Unicode (lone surrogates).
    """
    salt = os.urandom(SALT_BYTES) if salt is None else salt
    assert len(salt) == SALT_BYTES, salt
    digest = hashlib.sha256(salt + password.encode()).digest()
    return base64.b64encode(salt + digest).decode()


def is_password_hash(password_hash: str) -> bool:
    """Whether `password_hash` is a cleared password or a well-formed sha256 hash."""
    if password_hash == NO_PASSWORD:
        return True
    try:
        raw = base64.b64decode(password_hash, validate=True)
    except (binascii.Error, ValueError):
        return False
    return len(raw) == SALT_BYTES + DIGEST_BYTES


def check_password(password: str, password_hash: str) -> bool:
    """Whether `password` matches `password_hash`; never for a cleared or malformed hash."""
    if password_hash == NO_PASSWORD or not is_password_hash(password_hash):
        return False
    raw = base64.b64decode(password_hash)
    try:
        expected = hashlib.sha256(raw[:SALT_BYTES] + password.encode()).digest()
    except UnicodeEncodeError:
        return False
    return hmac.compare_digest(expected, raw[SALT_BYTES:])


@dataclass(frozen=True, slots=True)
class User:
    name: str
    password_hash: str
    tags: tuple[str, ...]

    @property
    def has_password(self) -> bool:
        return self.password_hash != NO_PASSWORD


def login_allowed(username: str, peer_is_loopback: bool) -> bool:
    """RabbitMQ's rule: users in `loopback_users` may connect only from loopback."""
    return peer_is_loopback or username not in LOOPBACK_USERS
