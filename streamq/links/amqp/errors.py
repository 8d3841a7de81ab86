"""Why an outbound connection or channel ended, as one exception family.

Owns `AmqpConnectionError` (refused, timed out, TLS failure, connection.close from the
broker, a protocol error, missed heartbeats) and `ChannelClosedError` (channel.close from
the broker, a consumer the broker cancelled). Their messages are one line fit for a
link's status; they never carry a password.
"""

from __future__ import annotations

import asyncio
from typing import TypeVar

_T = TypeVar("_T")


class AmqpConnectionError(Exception):
    """The connection failed or ended; `reply_code` is the broker's when it closed it
    (403 ACCESS_REFUSED, 320 CONNECTION_FORCED...), else 0."""

    def __init__(self, message: str, reply_code: int = 0) -> None:
        super().__init__(message)
        self.reply_code = reply_code


class ChannelClosedError(AmqpConnectionError):
    """The broker closed the channel (channel.close: `reply_code` and `reply_text`, such
    as 404 "NOT_FOUND - no queue 'q' in vhost '/'"), or cancelled its consumer (code 0)."""

    def __init__(self, reply_code: int, reply_text: str, channel: int) -> None:
        super().__init__(f"channel {channel} closed: {reply_text}", reply_code)
        self.reply_text = reply_text
        self.channel = channel


def mark_retrieved(future: asyncio.Future[_T]) -> None:
    """A done callback marking a future's exception as seen: a closed link is reported
    through its state, not as asyncio's "exception was never retrieved"."""
    if not future.cancelled():
        future.exception()
