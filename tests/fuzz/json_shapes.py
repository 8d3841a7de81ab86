"""Structure-aware inputs for the JSON parsers (definitions documents, HTTP API bodies):
byte mutations alone almost never get past the JSON syntax, so a fuzz input can also
be read as edits to a valid document.

`edited(data, documents)` reads `data` as: a document index, then edits of 3 bytes
each (what to do, where, with which value): replace a value, delete a key or an entry,
add a key, duplicate a list entry. Values come from VALUES, the ones parsers trip over
(wrong types, huge numbers, long and odd strings, nesting). Each byte string gives one
document, so libFuzzer's mutations of the bytes are mutations of the document and its
coverage guidance still works.
"""

from __future__ import annotations

import copy
import json
from typing import Final

JSON = None | bool | int | float | str | list["JSON"] | dict[str, "JSON"]

VALUES: Final[list[JSON]] = [
    None,
    True,
    False,
    0,
    -1,
    1,
    2**31,
    2**63,
    -(2**63) - 1,
    10**400,
    1.5,
    -0.0,
    1e308,
    "",
    "x",
    "/",
    "%2F",
    "..",
    "../../etc",
    "amq.topic",
    "amq.gen-x",
    "x" * 300,
    "\x00",
    "\ud800",
    "é",
    "*",
    "^[",
    "(a+)+$",
    "true",
    "1",
    "-1",
    "1.5",
    "classic",
    "quorum",
    "stream",
    "topic",
    "headers",
    "x-consistent-hash",
    "management",
    "administrator",
    [],
    [None],
    ["a", 1],
    {},
    {"a": 1},
    {"x-queue-type": "stream"},
    {"x-max-length": -1},
    {"x-message-ttl": "1"},
    {"x-dead-letter-exchange": 1},
    [[[[[[[[[[[]]]]]]]]]]],
]
KEYS: Final = [
    "name",
    "vhost",
    "type",
    "durable",
    "auto_delete",
    "internal",
    "arguments",
    "source",
    "destination",
    "destination_type",
    "routing_key",
    "user",
    "password",
    "password_hash",
    "hashing_algorithm",
    "tags",
    "configure",
    "write",
    "read",
    "pattern",
    "apply-to",
    "definition",
    "priority",
    "component",
    "value",
    "queues",
    "exchanges",
    "bindings",
    "users",
    "vhosts",
    "permissions",
    "policies",
    "parameters",
    "payload",
    "payload_encoding",
    "properties",
    "count",
    "ackmode",
    "encoding",
    "truncate",
]
EDIT_BYTES: Final = 3


# An edit's `where` is one byte: of a document's containers and slots only the first
# 256 (depth first) can be picked, and `where % count` is `where` once there are more.
# The walks stop there, so an edit costs the same on RabbitMQ's whole export as on a
# small body (the walks were most of the definitions module's time per input).
REACHABLE: Final = 256


def _slots(value: JSON, into: list[tuple[list[JSON] | dict[str, JSON], int | str]]) -> None:
    """The first REACHABLE (container, key) pairs in `value`, depth first."""
    if isinstance(value, dict):
        for key in list(value):
            if len(into) >= REACHABLE:
                return
            into.append((value, key))
            _slots(value[key], into)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            if len(into) >= REACHABLE:
                return
            into.append((value, index))
            _slots(item, into)


def _containers(value: JSON, into: list[list[JSON] | dict[str, JSON]]) -> None:
    """The first REACHABLE containers in `value` (itself first), depth first."""
    if len(into) >= REACHABLE or not isinstance(value, dict | list):
        return
    into.append(value)
    for item in value.values() if isinstance(value, dict) else value:
        if isinstance(item, dict | list):
            _containers(item, into)


_texts: dict[int, tuple[JSON, str]] = {}


def _fresh(document: JSON) -> JSON:
    """A copy of `document` to edit: parsed again from its JSON text (kept per document,
    with the document, so that its id stays its own), several times faster than
    copy.deepcopy. Documents are JSON values: the round trip gives them back equal."""
    kept = _texts.get(id(document))
    if kept is None or kept[0] is not document:
        kept = _texts[id(document)] = (document, json.dumps(document))
    return json.loads(kept[1])  # type: ignore[no-any-return]  # a JSON value


def edited(data: bytes, documents: list[JSON]) -> JSON:
    """The document `data` selects, with the edits it spells (module docstring)."""
    document = _fresh(documents[data[0] % len(documents)] if data else documents[0])
    for at in range(1, len(data) - EDIT_BYTES + 1, EDIT_BYTES):
        kind, where, what = data[at], data[at + 1], data[at + 2]
        if kind % 4 == 2:
            containers: list[list[JSON] | dict[str, JSON]] = []
            _containers(document, containers)
            if not containers:
                continue
            container = containers[where % len(containers)]
            if isinstance(container, dict):
                container[KEYS[what % len(KEYS)]] = copy.deepcopy(VALUES[what % len(VALUES)])
            elif container:
                container.append(copy.deepcopy(container[what % len(container)]))
            continue
        slots: list[tuple[list[JSON] | dict[str, JSON], int | str]] = []
        _slots(document, slots)
        if not slots:
            document = copy.deepcopy(VALUES[what % len(VALUES)])
            continue
        container, key = slots[where % len(slots)]
        if kind % 4 == 3:
            del container[key]  # type: ignore[arg-type]  # key is the container's own
        else:
            container[key] = copy.deepcopy(VALUES[what % len(VALUES)])  # type: ignore[index]
    return document
