"""A listener's unix socket: what may be removed before binding it, and the listener.

Owns `remove_stale_socket`, shared by the AMQP and MQTT unix listeners: a socket file
that a dead broker left behind is removed (nothing accepts on it: connect is refused),
while a live listener's socket (another broker, or a full backlog: the connect would
block) and anything that is not a socket are refused with an OSError, so that starting
a second broker never steals the first one's path. And `listen_unix`, which binds a
gateway's protocol factory there (mode 0666, as LavinMQ: any local user may connect,
then log in) and returns a `UnixListener`, which removes its file when closed.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

UNIX_SOCKET_MODE: Final = 0o666


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


@dataclass(frozen=True, slots=True)
class UnixListener:
    """A listening unix socket and the inode of its file (removed at `close`)."""

    server: asyncio.Server
    path: str
    inode: int

    def close(self) -> None:
        """Stop listening and remove the socket file, unless another process has put
        its own there since."""
        self.server.close()
        try:
            if os.lstat(self.path).st_ino == self.inode:
                os.unlink(self.path)
        except OSError:
            pass  # gone already, or not ours to remove


async def listen_unix(
    factory: Callable[[], asyncio.BaseProtocol], path: str, *, start_serving: bool = True
) -> UnixListener:
    """Listen on a unix socket at `path` with `factory`'s protocols, removing a socket
    file a dead broker left there. `start_serving` False: bound, accepting only after
    `start_serving()`. Raises OSError if `path` is something else than a socket, another
    process listens on it, or it cannot be bound."""
    remove_stale_socket(path)
    loop = asyncio.get_running_loop()
    server = await loop.create_unix_server(factory, path, start_serving=start_serving)
    os.chmod(path, UNIX_SOCKET_MODE)
    return UnixListener(server, path, os.lstat(path).st_ino)
