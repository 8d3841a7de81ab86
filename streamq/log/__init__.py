"""Layer L1: the append-only segment log. No asyncio servers, codec or HTTP code here."""

from streamq.log.errors import (
    LogClosed,
    LogError,
    LogFailed,
    OffsetOutOfRange,
    RecordTooLarge,
    SegmentCorrupted,
)
from streamq.log.format import Message, Record

__all__ = [
    "LogClosed",
    "LogError",
    "LogFailed",
    "Message",
    "OffsetOutOfRange",
    "Record",
    "RecordTooLarge",
    "SegmentCorrupted",
]
