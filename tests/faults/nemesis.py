"""The faults the suite injects into a FaultCluster, each one injected, held and healed
in one call, and the schedules that string them together: `SCHEDULE` for `make test`
(every kind once, short holds) and `random_schedule` for the `make chaos` soak.

Holds are counted from the lease TTL: a fault held past it makes the cluster fail over
(the leader cut from etcd or paused loses its lease), a shorter one must not.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable
from typing import Final

from tests.cluster.cluster_nodes import ClusterNode
from tests.faults.fault_cluster import FaultCluster

SETTLE_TIMEOUT_S: Final = 45.0  # a serving leader again after a fault is healed
IN_SYNC_TIMEOUT_S: Final = 90.0  # and every node in sync again
FLAP_PERIOD_S: Final = 0.5
CLOCK_STEP_S: Final = 3600  # how far a node's wall clock jumps (tests/faults/clock.py)
TRAFFIC_S: Final = 1.0  # clients run undisturbed between two faults

Step = Callable[[FaultCluster], None]


def _leader(fc: FaultCluster) -> ClusterNode:
    assert fc.cluster is not None
    return fc.cluster.wait_leader(SETTLE_TIMEOUT_S)


def _followers(fc: FaultCluster, leader: ClusterNode) -> list[ClusterNode]:
    return [node for node in fc.nodes if node is not leader]


def _past_lease(fc: FaultCluster) -> float:
    return fc.lease_ttl_s + 2.0


def leader_from_followers(fc: FaultCluster) -> None:
    """The leader keeps etcd but loses its followers: it must stop confirming (the ISR
    shrinks first, in etcd) and go on alone."""
    leader = _leader(fc)
    fc.record("partition leader|followers", leader.name)
    fc.network.split([fc.host(leader)], [fc.host(f) for f in _followers(fc, leader)])
    time.sleep(_past_lease(fc))
    fc.network.heal()


def leader_from_etcd(fc: FaultCluster) -> None:
    """The leader keeps its followers but loses etcd: it steps down within its lease."""
    leader = _leader(fc)
    fc.record("partition leader|etcd", leader.name)
    fc.network.cut(fc.host(leader), fc.hosts["etcd"])
    time.sleep(_past_lease(fc))
    fc.network.heal()


def leader_in_minority(fc: FaultCluster) -> None:
    """The leader alone on one side, its followers and etcd on the other."""
    leader = _leader(fc)
    fc.record("partition minority|majority", leader.name)
    others = [fc.host(f) for f in _followers(fc, leader)] + [fc.hosts["etcd"]]
    fc.network.split([fc.host(leader)], others)
    time.sleep(_past_lease(fc))
    fc.network.heal()


def follower_from_everyone(fc: FaultCluster) -> None:
    """A follower's link goes down (clients, etcd and the leader lose it)."""
    follower = _followers(fc, _leader(fc))[0]
    fc.record("isolate follower", follower.name)
    fc.network.set_link(fc.host(follower), up=False)
    time.sleep(_past_lease(fc))
    fc.network.heal()


def flapping_link(fc: FaultCluster) -> None:
    """The link between the leader and a follower goes and comes back every half second
    (this kernel has no netem for loss: a flap is the lossy link)."""
    leader = _leader(fc)
    follower = _followers(fc, leader)[-1]
    fc.record("flap leader|follower", f"{leader.name}|{follower.name}")
    end = time.monotonic() + _past_lease(fc)
    while time.monotonic() < end:
        fc.network.cut(fc.host(leader), fc.host(follower))
        time.sleep(FLAP_PERIOD_S)
        fc.network.mend(fc.host(leader), fc.host(follower))
        time.sleep(FLAP_PERIOD_S)


def pause_leader(fc: FaultCluster) -> None:
    """SIGSTOP of the leader past its lease, then SIGCONT: it must not confirm anything
    once it wakes up without a lease."""
    leader = _leader(fc)
    fc.pause(leader)
    time.sleep(_past_lease(fc))
    fc.resume(leader)


def pause_follower(fc: FaultCluster) -> None:
    follower = _followers(fc, _leader(fc))[0]
    fc.pause(follower)
    time.sleep(_past_lease(fc))
    fc.resume(follower)


def pause_etcd(fc: FaultCluster) -> None:
    assert fc.etcd is not None
    fc.record("pause", "etcd")
    fc.etcd.pause()
    time.sleep(_past_lease(fc))
    fc.record("resume", "etcd")
    fc.etcd.resume()


def kill_leader(fc: FaultCluster) -> None:
    leader = _leader(fc)
    fc.kill(leader)
    _leader(fc)  # a new leader from the followers
    fc.restart(leader)


def kill_follower(fc: FaultCluster) -> None:
    follower = _followers(fc, _leader(fc))[0]
    fc.kill(follower)
    time.sleep(fc.lease_ttl_s)
    fc.restart(follower)


def kill_etcd(fc: FaultCluster) -> None:
    assert fc.etcd is not None
    fc.record("kill and restart", "etcd")
    fc.etcd.restart(down_s=fc.lease_ttl_s)


def clock_steps(fc: FaultCluster) -> None:
    """The wall clocks of the leader and of a follower jump an hour, one forward and the
    other back, then the other way round, each held past the lease, then back to true
    (libfaketime: tests/faults/clock.py; the host's clock is not touched). Leases,
    replication and timeouts run on the monotonic clock: nothing may fail over for it
    (test_faults checks that no lease changed hands)."""
    leader = _leader(fc)
    follower = _followers(fc, leader)[0]
    for sign in (1, -1):
        fc.step_clock(leader, sign * CLOCK_STEP_S)
        fc.step_clock(follower, -sign * CLOCK_STEP_S)
        time.sleep(_past_lease(fc))
    fc.step_clock(leader, 0)
    fc.step_clock(follower, 0)


def leader_clock_back_from_etcd(fc: FaultCluster) -> None:
    """The leader is cut from etcd and its wall clock jumps back an hour at once: a lease
    timed on the wall clock would look valid for that hour, and the node would go on
    confirming after etcd had let its lease go (the checker's fencing and one-writer
    rules catch that); on the monotonic clock it steps down within its lease."""
    leader = _leader(fc)
    fc.record("partition leader|etcd", leader.name)
    fc.network.cut(fc.host(leader), fc.hosts["etcd"])
    fc.step_clock(leader, -CLOCK_STEP_S)
    time.sleep(_past_lease(fc))
    fc.network.heal()
    fc.step_clock(leader, 0)


SCHEDULE: Final[list[Step]] = [
    leader_from_followers,
    pause_leader,
    leader_from_etcd,
    kill_leader,
    flapping_link,
    pause_follower,
    leader_in_minority,
    kill_etcd,
    follower_from_everyone,
    pause_etcd,
    kill_follower,
    clock_steps,
    leader_clock_back_from_etcd,
]


def random_schedule(seed: int, count: int) -> list[Step]:
    """`count` faults drawn from SCHEDULE with `seed`."""
    chooser = random.Random(seed)
    return [chooser.choice(SCHEDULE) for _ in range(count)]


def run_schedule(fc: FaultCluster, steps: Iterable[Step]) -> None:
    """Each step (healed when it returns), then a serving leader and every node back in
    sync ("settled"), and some undisturbed traffic: each fault starts from a whole
    cluster (a leader killed while it is the only node in sync leaves nobody to elect)."""
    assert fc.cluster is not None
    for step in steps:
        step(fc)
        _leader(fc)
        fc.cluster.wait_in_sync(fc.nodes, IN_SYNC_TIMEOUT_S)
        fc.record("settled", step.__name__)
        time.sleep(TRAFFIC_S)
