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
from streamq.broker.link_definitions import ParameterInvalid, shovel_definition
from streamq.links.amqp.client import DirectConnector
from streamq.links.shovel_endpoints import Opener
from streamq.links.shovels import Shovel

logger = logging.getLogger(__name__)

SHOVEL: Final = "shovel"
NODE: Final = f"streamq@{socket.gethostname()}"  # as /api/overview names the node
DIRECT_USER_DEFAULT: Final = "guest"


class LinkSupervisor:
    """Starts and stops the links of a broker's runtime parameters."""

    def __init__(self, broker: Broker, direct: DirectConnector | None, amqp_port: int) -> None:
        self.broker = broker
        self.direct = direct  # `amqp://` with no host: this broker, without the network
        self.amqp_port = amqp_port  # this broker's AMQP port (for what needs a socket)
        self._stopping: set[asyncio.Task[None]] = set()
        self._started = False

    def start(self) -> None:
        """Follow parameter changes from now on and start the links of every parameter
        there is (those of the data directory, and of definitions loaded at boot)."""
        self._started = True
        self.broker.parameter_listeners.append(self._on_parameter)
        for vhost in list(self.broker.vhosts.values()):
            for parameter in vhost.parameters.list(SHOVEL):
                self._on_parameter(vhost.name, SHOVEL, parameter.name, parameter.value)

    async def stop(self) -> None:
        """Stop every link (shutdown): their sessions close, unacked messages go back."""
        if self._on_parameter in self.broker.parameter_listeners:
            self.broker.parameter_listeners.remove(self._on_parameter)
        links = list(self.broker.links.values())
        self.broker.links.clear()
        await asyncio.gather(*(link.stop() for link in links), *self._stopping)

    def _on_parameter(self, vhost: str, component: str, name: str, value: dict | None) -> None:
        if component == SHOVEL:
            self._shovel_changed(vhost, name, value)

    def _shovel_changed(self, vhost: str, name: str, value: dict | None) -> None:
        """Start, replace or stop the shovel of parameter `name` (value None: deleted)."""
        key = (SHOVEL, vhost, name)
        old = self.broker.links.get(key)
        if isinstance(old, Shovel) and value is not None and old.value == value:
            return  # the same definition again (start-up and the listener both tell)
        stopped = None
        if old is not None:
            del self.broker.links[key]
            stopped = self._stop_later(old)
        if value is None:
            return
        try:
            definition = shovel_definition(value)
        except ParameterInvalid as exc:  # validated when stored; a hand-edited file?
            logger.error("shovel %s/%s not started: %s", vhost, name, exc)
            return
        user = str(value.get("user", "")) or DIRECT_USER_DEFAULT
        shovel = Shovel(
            vhost,
            name,
            value,
            definition,
            Opener(self.direct, vhost, user),
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
        try:
            await _delete_parameter(vhost.parameters, shovel.name)
        except Exception:  # the shovel is done either way; the parameter stays
            logger.exception("shovel %s/%s: parameter not deleted", shovel.vhost, shovel.name)
        logger.info("shovel %s/%s: done, parameter deleted", shovel.vhost, shovel.name)


async def _delete_parameter(parameters: object, name: str) -> None:
    result = parameters.delete(SHOVEL, name)  # type: ignore[attr-defined]
    if asyncio.iscoroutine(result):
        await result
