"""A virtual host: the composition of its components, and what its callers call.

`VHost` owns no message state of its own beyond its statistics and runtime parameters:
it opens one object per noun, wires them together and hands their calls to the
gateways (as attributes bound to the component that answers them, so that a call costs
what a method call did; the few values a gateway sets go through properties). From the
top of the import order down (docs/architecture.md, "The vhost's components"; the
import-linter contract in pyproject.toml holds it):

- `Delivery` (vhost_delivery.py): drain rounds, consumers, basic.get, flow control;
- `Settler` (vhost_settle.py): settle, requeue, reject, expiry, dead letters (it owns
  `DeadLetters`, dead_letters.py, for at-least-once queues);
- `Router` (vhost_routing.py): the queues a message goes to;
- `Entities` (vhost_entities.py): exchanges, queues, bindings, declared and deleted;
- `PolicySet` (vhost_policies.py): policies and operator policies, applied;
- `Publisher` (vhost_publish.py): the append of routed messages, limits on the way in,
  delayed messages, dedup caches;
- `Storage` (vhost_store.py): the message log, definitions and queue journals, stream
  directories, their sync rounds, restoring queues at start-up;
- `Schedule` (vhost_schedule.py): the queues due a drain and streams due a sync round.

A component calls those below it directly; the few calls that go up (a publish that
drains or dead-letters, a requeue that delivers at once, a declare that expires a
queue's head, a policy that drops held dead letters) are callables wired in here, once.
It is synchronous and single-threaded; the gateway calls `drain` when the vhost asks
for it through `wakeup`, so that deliveries are batched per event-loop turn.

Durability: durable exchanges, durable non-exclusive queues and the bindings between
durable ends are recorded in the definitions journal; each such queue records its
messages in its own journal (`streamq.queues.journal`). Both are sync companions of the
log, so one fsync round covers messages, queue journals and definitions alike. Opening a
vhost restores all of it before it returns: nothing is served before that.
"""

from __future__ import annotations

from collections.abc import Callable

from streamq.broker.deadletter import PropertiesCodec
from streamq.broker.definitions import COMPACT_SLACK_RECORDS, Op
from streamq.broker.parameters import RuntimeParameters
from streamq.broker.queue import Queue
from streamq.broker.stats import MessageStats
from streamq.broker.vhost_delivery import Delivery
from streamq.broker.vhost_entities import Entities
from streamq.broker.vhost_policies import PolicySet
from streamq.broker.vhost_publish import Publisher
from streamq.broker.vhost_records import entity_ops, restore
from streamq.broker.vhost_routing import RouteFields, Router
from streamq.broker.vhost_schedule import Schedule
from streamq.broker.vhost_settle import Settler
from streamq.broker.vhost_store import Storage
from streamq.log.syncer import Syncer


class VHost:
    """One virtual host: its components, and their calls for the gateways."""

    def __init__(
        self, name: str, directory: str, syncer: Syncer, *, failover: bool = False
    ) -> None:
        """Open the vhost and restore its durable state (blocking: start-up only). With
        `failover` (a node promoted to cluster leader), every message restored into a
        classic queue comes back flagged redelivered (see `Storage._restore_cursor`).

        Raises LogError, DefinitionsCorrupted and OSError.
        """
        self.name = name
        self.directory = directory
        self.storage = Storage(name, directory, syncer, failover=failover)
        self.log = self.storage.log
        # Bottom up. Each component's calls that the gateways make are bound here once.
        self.schedule = Schedule(name)
        self.kick = self.schedule.kick
        self.fail_queue = self.schedule.fail_queue
        self.stream_appended = self.schedule.stream_appended
        self.streams_to_sync = self.schedule.streams_to_sync
        self.sync_stream = self.schedule.sync_stream
        self.publisher = Publisher(name, directory, self.log, self.schedule)
        self.publish = self.publisher.publish
        self.publish_run = self.publisher.publish_run
        self.delay = self.publisher.delay
        self.due_delayed = self.publisher.due_delayed
        self.duplicate_free = self.publisher.duplicate_free
        self.delayed = self.publisher.delayed
        self.queue_dedupers = self.publisher.queue_dedupers
        ops = self.storage.open_definitions()
        self.definitions = self.storage.definitions
        self.policy_set = PolicySet(name, self.definitions)
        self.policies = self.policy_set.policies
        self.operator_policies = self.policy_set.operator_policies
        self.set_policy = self.policy_set.set_policy
        self.clear_policy = self.policy_set.clear_policy
        self.apply_policies = self.policy_set.apply_policies
        self.entities = Entities(name, self.storage, self.policy_set, self.publisher, self.schedule)
        self.policy_set.queues = self.entities.queues
        self.policy_set.exchanges = self.entities.exchanges
        self.exchanges = self.entities.exchanges
        self.queues = self.entities.queues
        self.exchange = self.entities.exchange
        self.declare_exchange = self.entities.declare_exchange
        self.delete_exchange = self.entities.delete_exchange
        self.bind = self.entities.bind
        self.unbind = self.entities.unbind
        self.queue = self.entities.queue
        self.declare_queue = self.entities.declare_queue
        self.delete_queue = self.entities.delete_queue
        self.remove_queue = self.entities.remove_queue
        self.purge_queue = self.entities.purge_queue
        self.expire_queues = self.entities.expire_queues
        self.retired_stats = self.entities.retired_stats
        self.binding_listeners = self.entities.binding_listeners
        self.stream_removed_listeners = self.entities.stream_removed_listeners
        self.router = Router(self.entities)
        self.route = self.router.route
        self.route_run = self.router.route_run
        self.dead_letter_route = self.router.dead_letter_route
        # Shovels and federation upstreams, recorded in the definitions journal.
        self.parameters = RuntimeParameters(name, self.definitions.record)
        # Message statistics (streamq.broker.stats): confirms and unroutable publishes,
        # and exchanges' publishes by name (deleted queues' counts: `retired_stats`).
        self.stats = MessageStats()
        self.exchange_stats: dict[str, MessageStats] = {}
        for op in ops:
            self._replay(op)
        snapshot = self._snapshot()
        if len(ops) > len(snapshot) + COMPACT_SLACK_RECORDS:
            self.definitions.replace(snapshot)
        self.settler = Settler(self.router, self.publisher, self.schedule)
        self.settle = self.settler.settle
        self.settle_classic = self.settler.settle_classic
        self.requeue = self.settler.requeue
        self.requeue_many = self.settler.requeue_many
        self.reject = self.settler.reject
        self.dead_letter = self.settler.dead_letter
        self.dead_letter_taken = self.settler.dead_letter_taken
        self.expire_heads = self.settler.expire_heads
        self.expire_head = self.settler.expire_head
        self.dead_letters = self.settler.dead_letters
        self.delivery = Delivery(self.entities, self.settler, self.schedule)
        self.drain = self.delivery.drain
        self.deliver_now = self.delivery.deliver_now
        self.take = self.delivery.take
        self.get = self.delivery.get
        self.add_consumer = self.delivery.add_consumer
        self.remove_consumer = self.delivery.remove_consumer
        self.queue_listeners = self.delivery.queue_listeners
        # The queues' contents, then the calls that go up the import order.
        self.publisher.stream_count = self.storage.restore_queues(
            self.queues.values(), self.dead_letters.restore
        )
        self.publisher.restore(self.exchanges, self.queues.values())
        self.publisher.drain_queue = self.delivery.drain_queue
        self.publisher.drop_head = self.settler.drop_head
        self.publisher.dead_letter_record = self.settler.dead_letter_record
        self.policy_set.drop_dead_letters = self.dead_letters.drop
        self.entities.expire_head = self.settler.expire_head
        self.settler.deliver_now = self.deliver_now
        self.dead_letters.drain = self.drain
        # Every call that goes up the import order is wired in above, before any is made.
        self.apply_policies()
        self.log.add_sync_companion(self.storage.prepare_sync)

    # -- storage ---------------------------------------------------------------------------

    def collect_segments(self) -> int:
        """Delete log segments that no queue needs any more (`Storage.collect_segments`)."""
        return self.storage.collect_segments(self.queues.values())

    async def sync(self) -> int:
        """Make every published message durable (group commit with all other callers),
        streams included."""
        # A delayed message touches no log record: wait for a round of the companions.
        durable = await self.log.sync(companions=self.delayed.unsynced)
        for queue in list(self.schedule.streams_unsynced):
            if queue.stream is not None:
                await queue.stream.log.sync()
        return durable

    # -- the components' values that the gateways read and set ------------------------------

    @property
    def dirty(self) -> set[Queue]:
        return self.schedule.dirty

    @property
    def wakeup(self) -> Callable[[], None]:
        return self.schedule.wakeup

    @wakeup.setter
    def wakeup(self, wakeup: Callable[[], None]) -> None:
        self.schedule.wakeup = wakeup

    @property
    def default_queue_type(self) -> str | None:
        return self.entities.default_queue_type

    @default_queue_type.setter
    def default_queue_type(self, queue_type: str | None) -> None:
        self.entities.default_queue_type = queue_type

    @property
    def decode_for_route(self) -> Callable[[bytes], RouteFields]:
        return self.router.decode_for_route

    @decode_for_route.setter
    def decode_for_route(self, decode: Callable[[bytes], RouteFields]) -> None:
        self.router.decode_for_route = decode

    @property
    def properties_codec(self) -> PropertiesCodec | None:
        return self.router.properties_codec

    @properties_codec.setter
    def properties_codec(self, codec: PropertiesCodec | None) -> None:
        self.router.properties_codec = codec

    @property
    def publish_rejected(self) -> bool:
        """Whether the last publish was refused by a full queue (the gateway reads
        `publisher.publish_rejected` on its publish path)."""
        return self.publisher.publish_rejected

    @property
    def on_delay(self) -> Callable[[int], None]:
        return self.publisher.on_delay

    @on_delay.setter
    def on_delay(self, on_delay: Callable[[int], None]) -> None:
        self.publisher.on_delay = on_delay

    @property
    def streams_unsynced(self) -> set[Queue]:
        return self.schedule.streams_unsynced

    @property
    def stream_synced_listeners(self) -> list[Callable[[Queue], None]]:
        return self.schedule.stream_synced_listeners

    def needs_sync(self) -> bool:
        """Whether definitions, queue journals or delayed messages hold changes not yet
        written."""
        return self.storage.needs_sync() or self.delayed.dirty

    async def sync_all(self) -> None:
        """Make every change so far durable: messages, queue journals, definitions."""
        await self.storage.sync_all()

    async def aclose(self) -> None:
        """Write and fsync everything buffered (after any round in flight), then close."""
        try:
            await self.storage.close(self.queues.values())
        finally:
            self._close_journals()

    def close(self) -> None:
        """Write and fsync everything buffered, then close (blocking: shutdown only)."""
        try:
            self.storage.close_blocking(self.queues.values())
        finally:
            self._close_journals()

    def _close_journals(self) -> None:
        self.storage.close_journals(self.queues.values())
        self.delayed.close()

    # -- replaying and snapshotting the definitions journal -------------------------------

    def _replay(self, op: Op) -> None:
        """Replay one definitions record: a change, applied without side effects, by the
        component whose state it records. Raises DefinitionsCorrupted."""
        kind = op["op"]
        if kind in ("policy", "operator_policy", "policy.delete", "operator_policy.delete"):
            self.policy_set.restore(op)
        elif kind in ("parameter", "parameter.delete"):
            self.parameters.restore(op)
        else:
            restore(self.entities, op)

    def _snapshot(self) -> list[Op]:
        """The definitions records that recreate every durable entity, policy and
        parameter as it is now."""
        return entity_ops(self.entities) + self.policy_set.ops() + self.parameters.ops()
