"""Types of the C extension `streamq.broker._message` (source: `_message.c`).

`StoredMessage`, the broker's record of one routed message, as a type CPython's cyclic
collector does not track. Its fields hold only str, bytes and integers: construction refuses
anything else (TypeError), subclasses of str and bytes included; the str and bytes fields
are read-only, the integer ones take only integers.
"""

class StoredMessage:
    """A routed message's contents, shared by every queue it went to (`refs` of them)."""

    offset: int
    refs: int
    timestamp_ms: int  # when it was published: TTLs count from here
    @property
    def exchange(self) -> str: ...
    @property
    def routing_key(self) -> str: ...
    @property
    def properties_raw(self) -> bytes: ...
    @property
    def body(self) -> bytes: ...
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
    def release(self) -> int:
        """One queue is done with the message: `refs` goes down by one; returns what is
        left."""
