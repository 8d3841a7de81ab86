"""The one error `streamq perf` reports to its user.

Owns `PerfError`: an operating error (refused connection, a close from the broker, a bad
URI or flag, a timeout) that the command turns into a one-line message on stderr and exit
status 1. Nothing here knows about sockets or frames.
"""

from __future__ import annotations


class PerfError(Exception):
    """An operating error of the load generator; its text is the whole user message."""
