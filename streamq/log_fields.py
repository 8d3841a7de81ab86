"""Structured fields of log lines: which connection, vhost, queue or user a line is about.

Owns `FieldsLogger`, a logger adapter that carries a scope's fields (a connection's name,
its user and vhost once known) into every line logged through it, merged with the
call's own `extra=`. The fields become attributes of the `LogRecord`, as `extra=` always
makes them; the JSON format (streamq/log_output.py) writes every such attribute as a
key of the line's object, and the text format leaves lines as they were. A call site
outside any scope passes its fields itself: `logger.error(..., extra={"vhost": name})`.

The field names are the ones below, so that a tool filters on one name everywhere. It
formats nothing and touches no handler.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Final

# The names used across the broker; a call may add others of its own.
CONNECTION: Final = "connection"  # "peer_host:peer_port -> host:port", as the HTTP API's
VHOST: Final = "vhost"
QUEUE: Final = "queue"
USER: Final = "user"
CHANNEL: Final = "channel"
# An exception object: the JSON log writes its type, message and traceback.
EXCEPTION: Final = "exception"


class FieldsLogger(logging.LoggerAdapter[logging.Logger]):
    """A logger whose lines carry `fields` (mutable: a scope adds what it learns, as a
    connection its user at login), merged under the call's own `extra=`."""

    def __init__(self, logger: logging.Logger, **fields: object) -> None:
        super().__init__(logger, fields)
        self.fields: dict[str, object] = fields

    def process(
        self, msg: object, kwargs: MutableMapping[str, object]
    ) -> tuple[object, MutableMapping[str, object]]:
        given = kwargs.get("extra")
        merged = dict(self.fields)
        if isinstance(given, dict):
            merged.update(given)
        kwargs["extra"] = merged
        return msg, kwargs
