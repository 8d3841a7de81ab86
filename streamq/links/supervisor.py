"""What runs the broker's links: shovels (and federation links) started, replaced and
stopped as their runtime parameters change.

Owns `LinkSupervisor`: it follows `Broker.parameter_listeners`, keeps one running link per
parameter in `Broker.links`, and stops them all at shutdown (before the gateway closes, so
that direct sessions end cleanly). It must not validate parameters (the HTTP API and
definitions import did) nor move messages (shovels.py).

Each component has its own small functions here (`_shovel_changed`, ...): the federation
links are added the same way.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Final

from streamq.broker.broker import Broker
from streamq.broker.link_definitions import ShovelDefinition
from streamq.broker.links import SHOVEL, link_key
from streamq.links.amqp.client import DirectConnector
from streamq.links.federation.runtime import Federation
from streamq.links.shovel_endpoints import Opener
from streamq.links.shovels import Shovel
from streamq.log.errors import LogError

logger = logging.getLogger(__name__)

NODE: Final = f"streamq@{socket.gethostname()}"  # as /api/overview names the node
DIRECT_USER_DEFAULT: Final = "guest"


class LinkSupervisor:
    """Starts and stops the links of a broker's runtime parameters."""

    def __init__(self, broker: Broker, direct: DirectConnector | None, amqp_port: int) -> None:
        self.broker = broker
        self.direct = direct  # `amqp://` with no host: this broker, without the network
        self.amqp_port = amqp_port  # this broker's AMQP port (for what needs a socket)
        self._stopping: set[asyncio.Task[None]] = set()
        self.federation = Federation(broker, direct)

    def start(self) -> None:
        """Follow parameter changes from now on and start the links of every parameter
        there is (those of the data directory, and of definitions loaded at boot)."""
        # Appending replays every parameter there is to the listener first.
        self.broker.parameter_listeners.append(self._on_parameter)
        self.federation.start()

    async def stop(self) -> None:
        """Stop every link (shutdown): their sessions close, unacked messages go back."""
        if self._on_parameter in self.broker.parameter_listeners:
            self.broker.parameter_listeners.remove(self._on_parameter)
        await self.federation.aclose()  # its links leave Broker.links
        shovels = [link for link in self.broker.links.values() if isinstance(link, Shovel)]
        for shovel in shovels:
            del self.broker.links[link_key(SHOVEL, shovel.vhost, shovel.name)]
        await asyncio.gather(*(shovel.stop() for shovel in shovels), *self._stopping)

    def _on_parameter(self, vhost: str, component: str, name: str, value: object) -> None:
        if component == SHOVEL:
            self._shovel_changed(vhost, name, value)
        else:
            self.federation.parameter_changed(vhost, component, name, value)

    def _shovel_changed(self, vhost: str, name: str, value: object) -> None:
        """Start, replace or stop the shovel of parameter `name` (value None: deleted)."""
        key = link_key(SHOVEL, vhost, name)
        old = self.broker.links.get(key)
        if isinstance(old, Shovel) and value is not None and old.value == value:
            return  # the same definition again
        stopped = None
        if isinstance(old, Shovel):
            del self.broker.links[key]
            stopped = self._stop_later(old)
        found = self.broker.vhosts.get(vhost)
        parameter = None if found is None else found.parameters.parameter(SHOVEL, name)
        if value is None or parameter is None:
            return
        assert isinstance(parameter.definition, ShovelDefinition)  # component "shovel"
        shovel = Shovel(
            vhost,
            name,
            value,
            parameter.definition,
            Opener(self.direct, vhost, parameter.user or DIRECT_USER_DEFAULT),
            NODE,
            self._shovel_done,
        )
        self.broker.links[key] = shovel
        shovel.start(stopped)

    def _stop_later(self, link: Shovel) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(link.stop())
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)
        return task

    async def _shovel_done(self, shovel: Shovel) -> None:
        """src-delete-after reached: the shovel deletes its own parameter (RabbitMQ)."""
        key = (SHOVEL, shovel.vhost, shovel.name)
        if self.broker.links.get(key) is shovel:
            del self.broker.links[key]
        vhost = self.broker.vhosts.get(shovel.vhost)
        if vhost is None or vhost.parameters.get(SHOVEL, shovel.name) != shovel.value:
            return  # deleted or replaced meanwhile
        vhost.parameters.delete(SHOVEL, shovel.name)
        logger.info("shovel %s/%s: done, parameter deleted", shovel.vhost, shovel.name)
        try:
            await vhost.sync_all()  # the deletion is durable once this returns
        except LogError as exc:
            logger.error("shovel %s/%s: deletion not synced: %s", shovel.vhost, shovel.name, exc)
