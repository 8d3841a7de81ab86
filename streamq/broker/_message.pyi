"""Types of the C extension `streamq.broker._message` (source: `_message.c`).

`StoredMessage`, the broker's record of one routed message, as a type CPython's cyclic
collector does not track. Its fields hold only str, bytes and integers; the setters refuse
anything else (TypeError), subclasses of str and bytes included.
"""

class StoredMessage:
    """A routed message's contents, shared by every queue it went to (`refs` of them)."""

    offset: int
    exchange: str
    routing_key: str
    properties_raw: bytes
    body: bytes
    refs: int
    timestamp_ms: int  # when it was published: TTLs count from here

    def __init__(
        self,
        offset: int,
        exchange: str,
        routing_key: str,
        properties_raw: bytes,
        body: bytes,
        refs: int,
        timestamp_ms: int = 0,
    ) -> None: ...
