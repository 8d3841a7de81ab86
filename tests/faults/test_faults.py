"""The bounded fault suite: a three-node cluster and etcd, each on a test host of its
own (network namespaces), publishers with confirms and consumers with acks on every
node throughout, and every kind of fault of tests/faults/nemesis.py once (partitions,
pauses, kills of nodes and of etcd, a flapping link, wall-clock steps); then heal, drain,
and the checker (tests/faults/checker.py) on the whole history. `make chaos` runs the
long soak."""

from __future__ import annotations

from pathlib import Path
from typing import Final

from tests.faults.fault_run import fault_run
from tests.faults.history import Publish, Tenure
from tests.faults.nemesis import SCHEDULE

CONFIRMED_MIN: Final = 200  # the clients did work through the run, not just at its ends


def test_no_confirmed_message_is_lost_through_every_kind_of_fault(tmp_path: Path) -> None:
    result = fault_run(tmp_path, SCHEDULE)
    print(result.report())
    assert result.verdict.ok, result.report()
    assert result.verdict.confirmed >= CONFIRMED_MIN, result.report()
    assert result.verdict.acks > 0, result.report()
    confirmers = {
        e.node for e in result.events if isinstance(e, Publish) and e.outcome == "confirmed"
    }
    assert len(confirmers) >= 2, f"no failover moved the confirms: {confirmers}"
    leases = [e for e in result.events if isinstance(e, Tenure) and e.role == "lease"]
    assert len(leases) >= 2, leases
    settled = {fault.target for fault in result.faults if fault.kind == "settled"}
    assert settled == {step.__name__ for step in SCHEDULE}
    # Wall-clock steps of an hour (leader and follower) cost no failover: leases and
    # timeouts run on the monotonic clock.
    stepped = [f.at for f in result.faults if f.kind.startswith("clock")]
    done = next(f.at for f in result.faults if f.kind == "settled" and f.target == "clock_steps")
    elected = [t for t in leases if stepped and min(stepped) <= t.start <= done]
    assert stepped and not elected, f"a lease changed hands in a clock step: {elected}"
