"""Recovery on a full disk: what start-up would write, but can do without.

Owns the rule that a restart needs no free space. Recovery repairs by cutting (which
needs no room) and writes a few files it can also do without: the index of a segment
that was rolled but not yet sealed (the in-memory index built by the scan serves its
reads meanwhile). On a full disk that write is skipped, with a log line, the segment
stays unsealed (read through the descriptor; retention keeps it), and the next recovery
writes it. See docs/durability.md, "Full disk".
"""

from __future__ import annotations

import logging

from streamq.log.errors import OutOfSpace
from streamq.log.files import write_file_atomic

logger = logging.getLogger(__name__)


def write_index_or_defer(path: str, data: bytes) -> bool:
    """Write a rolled segment's index at recovery; False, with a log line, when the file
    system has no room for it (the segment then stays unsealed until a later start-up)."""
    try:
        write_file_atomic(path, data, fsync_dir=False)
    except OutOfSpace as exc:
        logger.warning(
            "index %s: not written at recovery, no room (%s); its segment is read "
            "unsealed until a restart finds room",
            path,
            exc,
        )
        return False
    return True
