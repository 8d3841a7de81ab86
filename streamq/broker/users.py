"""Users and their passwords, in RabbitMQ's `rabbit_password_hashing_sha256` format.

Owns credential checks: a password hash is base64(salt + sha256(salt + password)) with a
4-byte random salt, so that definitions exported from RabbitMQ keep working. It does not
know connections; the loopback-only rule for `guest` is applied by its caller.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from dataclasses import dataclass
from typing import Final

DEFAULT_USER: Final = "guest"
LOOPBACK_USERS: Final = frozenset({"guest"})  # RabbitMQ's loopback_users default


def hash_password(password: str, salt: bytes | None = None) -> str:
    salt = os.urandom(4) if salt is None else salt
    digest = hashlib.sha256(salt + password.encode()).digest()
    return base64.b64encode(salt + digest).decode()


def check_password(password: str, password_hash: str) -> bool:
    try:
        raw = base64.b64decode(password_hash, validate=True)
    except ValueError:
        return False
    if len(raw) != 4 + 32:
        return False
    expected = hashlib.sha256(raw[:4] + password.encode()).digest()
    return hmac.compare_digest(expected, raw[4:])


@dataclass(frozen=True, slots=True)
class User:
    name: str
    password_hash: str
    tags: tuple[str, ...]


class UserStore:
    """The users of a broker. Until user management lands, only the default guest."""

    def __init__(self) -> None:
        self.users = {DEFAULT_USER: User(DEFAULT_USER, hash_password("guest"), ("administrator",))}

    def authenticate(self, username: str, password: str) -> User | None:
        """The user if the password is right; None otherwise (without saying which part)."""
        user = self.users.get(username)
        if user is None or not check_password(password, user.password_hash):
            return None
        return user


def login_allowed(username: str, peer_is_loopback: bool) -> bool:
    """RabbitMQ's rule: users in `loopback_users` may connect only from loopback."""
    return peer_is_loopback or username not in LOOPBACK_USERS
