"""The broker's registry of running links (shovels and federation links), as the
management API shows them.

Owns what the links runtime (`streamq.links`, a layer above the gateways) publishes about
what it runs, so that the HTTP gateway can list, pause, resume and restart links without
importing it, as `clients.py` does for connections. The runtime registers each link in
`Broker.links` under `link_key(...)` when it starts it and removes it when it stops it.
Status views are taken on request, never on the hot path.
"""

from __future__ import annotations

from typing import Final, Protocol

SHOVEL: Final = "shovel"
FEDERATION: Final = "federation"
KINDS: Final = (SHOVEL, FEDERATION)
# RabbitMQ's states ("starting", "running", "terminated") and LavinMQ's "paused".
STATES: Final = ("starting", "running", "terminated", "paused")

LinkKey = tuple[str, str, str]  # (kind, vhost, name)


def link_key(kind: str, vhost: str, name: str) -> LinkKey:
    """The key of a link in `Broker.links`. A federation link's name is unique in its
    vhost: the runtime names it after its exchange or queue and upstream."""
    assert kind in KINDS, kind
    return (kind, vhost, name)


class Link(Protocol):
    """A shovel or a federation link the runtime registered in `Broker.links`."""

    @property
    def kind(self) -> str:
        """ "shovel" or "federation"."""

    @property
    def vhost(self) -> str: ...

    @property
    def name(self) -> str:
        """A shovel's parameter name; a federation link's unique name in its vhost."""

    @property
    def state(self) -> str:
        """One of STATES."""

    @property
    def error(self) -> str:
        """Why it is not running ("" when it is): refused, unreachable, closed by the
        peer with a reply code and text."""

    @property
    def transferred(self) -> int:
        """Messages moved since the link started (published to the destination)."""

    def status(self) -> dict[str, object]:
        """RabbitMQ's fields of `/api/shovels` (name, vhost, type "dynamic", state,
        src_uri and dest_uri with passwords redacted, src_queue/src_exchange/...,
        timestamp, reason when terminated) or of `/api/federation-links` (node,
        exchange or queue, upstream, upstream_exchange or upstream_queue, type, vhost,
        status, local_connection, uri redacted, timestamp, error); plus ours:
        transferred, and rates where the runtime has them."""

    def pause(self) -> None:
        """Stop moving messages (LavinMQ's pause): connections close, state "paused"."""

    def resume(self) -> None:
        """Undo `pause`: state "starting", then "running" once connected."""

    def restart(self) -> None:
        """Reconnect now (RabbitMQ's DELETE .../restart)."""
