"""Topic permissions: which routing keys a user may publish with, or bind with, on one
exchange of one vhost (RabbitMQ's `topic_permission`).

Owns the record (`TopicPermission`) and the decision (`TopicGrants.permitted`), made as
RabbitMQ's `rabbit_auth_backend_internal:check_topic_access` makes it:
- an exchange the user has no topic permission on allows every key;
- "" means nothing but the empty key (RabbitMQ turns it into "^$");
- `{username}`, `{vhost}` and the other variables given are replaced in the regex text
  before it is compiled, literally, without escaping (`binary:replace` in key order), so a
  name holding regex characters acts as a regex, as in RabbitMQ;
- the regex is searched in the routing key, not matched in full (`re:run`).

It does not know which exchanges are of type topic (the caller checks only those, as
rabbit_channel's `check_topic_authorisation` does) nor connections; it only reads.
Cost: a dict lookup per check, plus one regex search; the compiled regex per expansion is
cached by `re`'s own cache, the answers by the caller (amqp_gateway/access.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Literal

TopicKind = Literal["write", "read"]
TOPIC_KINDS: Final[tuple[TopicKind, ...]] = ("write", "read")
# What RabbitMQ checks for an empty permission: only the empty routing key.
EMPTY_PERMISSION_REGEX: Final = "^$"


@dataclass(frozen=True, slots=True)
class TopicPermission:
    """What `user` may do with routing keys on `exchange` in `vhost`: one regex per kind."""

    user: str
    vhost: str
    exchange: str
    write: str
    read: str


def amqp_variables(user: str, vhost: str) -> dict[str, str]:
    """The variables RabbitMQ gives an AMQP 0-9-1 connection (and its management API):
    the user and the vhost. `{client_id}` is given only to the connections of its MQTT and
    STOMP plugins (rabbit_channel:extract_variable_map_from_amqp_params), so it stays
    literal text here."""
    return {"username": user, "vhost": vhost}


def expand(regex: str, variables: Mapping[str, str]) -> str:
    """`regex` with each `{name}` of `variables` replaced by its value, in the order of
    the names (Erlang's `maps:fold` over a small map), without escaping the values."""
    for name in sorted(variables):
        regex = regex.replace("{" + name + "}", variables[name])
    return regex


class TopicGrants:
    """The topic permissions of one user in one vhost, by exchange."""

    __slots__ = ("_by_exchange",)

    def __init__(self, permissions: Iterable[TopicPermission]) -> None:
        self._by_exchange = {permission.exchange: permission for permission in permissions}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TopicGrants) and self._by_exchange == other._by_exchange

    __hash__ = None  # type: ignore[assignment]  # mutable-looking: compared, never hashed

    def permitted(
        self, exchange: str, kind: TopicKind, routing_key: str, variables: Mapping[str, str]
    ) -> bool:
        """Whether `routing_key` may be used to `kind` through `exchange` (see the module
        docstring for RabbitMQ's rules)."""
        permission = self._by_exchange.get(exchange)
        if permission is None:
            return True
        regex = permission.write if kind == "write" else permission.read
        pattern = expand(regex or EMPTY_PERMISSION_REGEX, variables)
        try:
            return re.search(pattern, routing_key) is not None
        except re.error:
            # The regex compiled when it was set; a variable's value broke it. RabbitMQ's
            # re:run fails then and the access is refused.
            return False
