"""A listener's unix socket path: what may be removed before binding it.

Owns `remove_stale_socket`, shared by the AMQP and MQTT unix listeners: a socket file
that a dead broker left behind is removed (nothing accepts on it: connect is refused),
while a live listener's socket (another broker, or a full backlog: the connect would
block) and anything that is not a socket are refused with an OSError, so that starting
a second broker never steals the first one's path.
"""

from __future__ import annotations

import errno
import os
import socket
import stat


def remove_stale_socket(path: str) -> None:
    """Remove a unix socket file nobody listens on; refuse anything else at `path`
    (OSError EEXIST: not a socket; EADDRINUSE: a process listens on it)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise OSError(errno.EEXIST, "the path exists and is not a socket")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.setblocking(False)
        try:
            probe.connect(path)
        except ConnectionRefusedError:
            os.unlink(path)  # a dead broker's socket
            return
        except BlockingIOError:
            pass  # a listener with a full backlog: alive
    raise OSError(errno.EADDRINUSE, "another process listens on this socket")
