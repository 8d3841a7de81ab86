"""Message deduplication, LavinMQ's way (`x-message-deduplication`).

Owns the cache of one exchange or queue declared with `x-message-deduplication: true`:
the value of the header `x-deduplication-header` (or of the header that the argument
`x-deduplication-header` names) is the message's key; a message whose key is in the
cache is a duplicate. The cache holds at most `x-cache-size` keys (128 by default; the
oldest goes first) for `x-cache-ttl` ms each (forever by default; a message's own
`x-cache-ttl` header overrides it). It is in memory only, as LavinMQ's: it starts empty
after a restart. Messages without the header are never duplicates.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from streamq.broker.errors import PreconditionFailed

DEFAULT_HEADER: Final = "x-deduplication-header"
CACHE_SIZE_DEFAULT: Final = 128
CACHE_SIZE_MAX: Final = 1 << 24  # keys one cache may hold, whatever the argument says


def _integer(arguments: Mapping[str, object], key: str) -> int | None:
    value = arguments.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise PreconditionFailed(f"{key} header not a Int")
    if value < 0:
        raise PreconditionFailed(f"{key} has to be positive")
    return value


def deduper_for(arguments: Mapping[str, object]) -> Deduper | None:
    """The cache that `arguments` ask for, None without `x-message-deduplication: true`.

    Raises PreconditionFailed, in LavinMQ's words, for arguments of a wrong type."""
    enabled = arguments.get("x-message-deduplication")
    if enabled is None:
        return None
    if not isinstance(enabled, bool):
        raise PreconditionFailed("x-message-deduplication header not a Bool")
    size = _integer(arguments, "x-cache-size")
    ttl_ms = _integer(arguments, "x-cache-ttl")
    header = arguments.get("x-deduplication-header")
    if header is not None and not isinstance(header, str):
        raise PreconditionFailed("x-deduplication-header header not a String")
    if not enabled:
        return None
    return Deduper(CACHE_SIZE_DEFAULT if size is None else size, ttl_ms, header or DEFAULT_HEADER)


def _key(value: object) -> object:
    if isinstance(value, dict):
        return tuple(sorted((k, _key(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_key(v) for v in value)
    return value


class Deduper:
    __slots__ = ("_cache", "header", "size_max", "ttl_ms")

    def __init__(self, size_max: int, ttl_ms: int | None, header: str) -> None:
        self.size_max = min(max(size_max, 1), CACHE_SIZE_MAX)
        self.ttl_ms = ttl_ms
        self.header = header
        self._cache: dict[object, int | None] = {}  # key -> deadline ms; insertion order

    def __len__(self) -> int:
        return len(self._cache)

    def duplicate(self, headers: Mapping[str, object] | None, now_ms: int) -> bool:
        """Whether the message is a duplicate; if not and it has a key, remember it."""
        if not headers:
            return False
        value = headers.get(self.header)
        if value is None:
            return False
        key = _key(value)
        cache = self._cache
        if key in cache:
            deadline = cache[key]
            if deadline is None or deadline > now_ms:
                return True
            del cache[key]
        if len(cache) >= self.size_max:
            del cache[next(iter(cache))]  # the oldest key goes first (LavinMQ's shift)
        ttl = headers.get("x-cache-ttl")
        if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl < 0:
            ttl = self.ttl_ms
        cache[key] = None if ttl is None else now_ms + ttl
        return False
