"""Which federation links run: one per federated exchange or queue and upstream.

Owns the set of running federation links of the broker and keeps it equal to what the
vhosts ask for: an exchange or queue whose effective policy has `federation-upstream`
(an upstream's name), `federation-upstream-set` (a set's name, or `all`) or
`federation-upstream-pattern` (a regular expression over upstream names) gets a link to
each of those upstreams (runtime parameters `federation-upstream`, a set's members with
their overrides). It looks again whenever a federation parameter changes and every
`RECONCILE_S` (policies, exchanges and queues come and go without telling it), starts
what is missing, restarts what changed, and stops what is no longer asked for, deleting
what those links declared upstream, as RabbitMQ does. Each link is registered in
`Broker.links` while it runs. At shutdown links stop and leave the upstream as it is, so
messages wait there for the next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Iterator, Mapping
from typing import Final

from streamq.broker.broker import Broker
from streamq.broker.link_definitions import UpstreamDefinition, UpstreamSetMember
from streamq.broker.links import FEDERATION, link_key
from streamq.broker.node_names import node_name
from streamq.broker.vhost import VHost
from streamq.links.amqp.client import DirectConnector
from streamq.links.federation.exchange_link import ExchangeLink
from streamq.links.federation.link import FederationLink, LinkEnvironment, LinkSpec
from streamq.links.federation.queue_link import QueueLink

logger = logging.getLogger(__name__)

RECONCILE_S: Final = 1.0
UPSTREAM: Final = "federation-upstream"
UPSTREAM_SET: Final = "federation-upstream-set"
UPSTREAM_PATTERN: Final = "federation-upstream-pattern"  # upstreams whose names match
COMPONENTS: Final = (UPSTREAM, UPSTREAM_SET)
ALL_UPSTREAMS: Final = "all"
INTERNAL_ARGUMENT: Final = "x-internal-purpose"

SpecKey = tuple[str, str, str, str]  # vhost, "exchange" or "queue", its name, upstream


class Federation:
    """The broker's federation links. Event-loop thread only."""

    def __init__(self, broker: Broker, direct: DirectConnector | None, node: str = "") -> None:
        self.broker = broker
        self.env = LinkEnvironment(broker, direct, node or node_name())
        self.links: dict[SpecKey, FederationLink] = {}
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="federation")

    def parameter_changed(self, vhost: str, component: str, name: str, value: object) -> None:
        """`Broker.parameter_listeners`: look again now if it is a federation parameter."""
        if component in COMPONENTS:
            self._changed.set()

    async def aclose(self) -> None:
        """Stop every link (the upstreams keep their queues: messages wait there)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        links, self.links = list(self.links.values()), {}
        for link in links:
            self._unregister(link)
        await asyncio.gather(*(link.stop(cleanup=False) for link in links))

    async def _run(self) -> None:
        while True:
            try:
                await self.reconcile()
            except Exception:  # a bug here must not end federation for good
                logger.exception("federation: reconcile failed")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), RECONCILE_S)

    async def reconcile(self) -> None:
        """Start, restart and stop links so that they match what the vhosts ask for."""
        wanted = {
            (spec.vhost, spec.resource_type, spec.resource, spec.upstream_name): spec
            for vhost in list(self.broker.vhosts.values())
            for spec in wanted_links(vhost)
        }
        stopping = []
        for key, link in list(self.links.items()):
            spec = wanted.get(key)
            if spec != link.spec:
                del self.links[key]
                self._unregister(link)
                # Changed: the new link takes over what this one declared upstream.
                stopping.append(link.stop(cleanup=spec is None))
        await asyncio.gather(*stopping)
        for key, spec in wanted.items():
            if key not in self.links:
                link = make_link(spec, self.env)
                self.links[key] = link
                self.broker.links[link_key(FEDERATION, spec.vhost, link.name)] = link
                link.start()

    def _unregister(self, link: FederationLink) -> None:
        self.broker.links.pop(link_key(FEDERATION, link.vhost, link.name), None)


def make_link(spec: LinkSpec, env: LinkEnvironment) -> FederationLink:
    if spec.resource_type == "exchange":
        return ExchangeLink(spec, env)
    return QueueLink(spec, env)


def wanted_links(vhost: VHost) -> Iterator[LinkSpec]:
    """A link spec for each federated exchange and queue of `vhost` and its upstreams."""
    parameters = vhost.parameters
    upstreams = {p.name: p for p in parameters.list(UPSTREAM)}
    if not upstreams:
        return
    sets = {p.name: p.definition for p in parameters.list(UPSTREAM_SET)}
    for exchange in vhost.exchanges.values():
        if exchange.name == "" or exchange.internal:
            continue  # RabbitMQ federates neither (nothing can bind to the default)
        for name, upstream, user in _upstreams_of(exchange.policy, upstreams, sets):
            yield LinkSpec(vhost.name, "exchange", exchange.name, name, upstream, user)
    for queue in vhost.queues.values():
        if queue.stream is not None or queue.exclusive or INTERNAL_ARGUMENT in queue.arguments:
            # Classic queues only, as RabbitMQ's federated queues; never a federation
            # link's own queue on a broker that is also an upstream.
            continue
        for name, upstream, user in _upstreams_of(queue.policy, upstreams, sets):
            yield LinkSpec(vhost.name, "queue", queue.name, name, upstream, user)


def _upstreams_of(
    policy: Mapping[str, object], upstreams: Mapping[str, object], sets: Mapping[str, object]
) -> Iterator[tuple[str, UpstreamDefinition, str]]:
    """(upstream name, definition, who set it) of each upstream a policy names."""
    single = policy.get(UPSTREAM)
    set_name = policy.get(UPSTREAM_SET)
    pattern = policy.get(UPSTREAM_PATTERN)
    members: list[UpstreamSetMember] = []
    if isinstance(single, str):
        members = [UpstreamSetMember(single)]
    elif isinstance(pattern, str):
        # The policy was checked: the pattern compiles (RabbitMQ 3.10's key).
        members = [UpstreamSetMember(n) for n in upstreams if re.search(pattern, n)]
    elif set_name == ALL_UPSTREAMS:
        members = [UpstreamSetMember(name) for name in upstreams]
    elif isinstance(set_name, str):
        found = sets.get(set_name)
        members = list(found) if isinstance(found, tuple) else []
    for member in members:
        parameter = upstreams.get(member.upstream)
        definition = getattr(parameter, "definition", None)
        if isinstance(definition, UpstreamDefinition):
            yield member.upstream, member.apply(definition), str(getattr(parameter, "user", ""))
