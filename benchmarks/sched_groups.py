"""Where a broker runs for the CPU scheduler, and whether it shares the load generator's
place (issue 30, item 6).

Owns `placement` (a process's session and, on a kernel with `sched_autogroup_enabled`,
its autogroup, from /proc) and `shared_with_caller`, the warning lines for brokers that
run in this process's session or autogroup. Linux shares the CPU fairly between
autogroups (one per session) before it shares it between their processes, so on a
loaded machine a process woken by a write from another group waits in the run queue far
longer than one woken from inside its own group. A broker started from the benchmark's
own shell is woken by its client inside one group, and round trips run several times
faster than against a broker started as a service would be (its own session, or its own
cgroup under systemd): measured on 2026-12-05 with one streamq tree started both ways,
1,039-1,895 against 217-253 Celery sends per second (docs/benchmarks.md). Side-by-side
rows are fair only when every broker is placed alike: start each with `setsid`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_SESSION_FIELD = 3
"""Index of proc(5)'s field 6 (session) among the fields after the command's ")"."""


@dataclass(frozen=True, slots=True)
class Placement:
    session: int
    autogroup: str | None  # "/autogroup-N", None without autogroups


def placement(pid: int) -> Placement | None:
    """The session and autogroup of process `pid`; None if it is gone or unreadable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        session = int(fields[_SESSION_FIELD])
    except (OSError, IndexError, ValueError):
        return None
    autogroup = None
    if _autogroups_enabled():
        try:
            autogroup = Path(f"/proc/{pid}/autogroup").read_text().split()[0]
        except (OSError, IndexError):
            autogroup = None
    return Placement(session, autogroup)


def _autogroups_enabled() -> bool:
    try:
        return Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
    except OSError:
        return False


def shared_with_caller(pids: dict[str, int | None]) -> list[str]:
    """A warning line per broker (name -> pid; None is skipped) that runs in this
    process's session or autogroup: its round trips are not comparable with those of a
    broker placed elsewhere."""
    mine = placement(os.getpid())
    if mine is None:
        return []
    lines = []
    for name, pid in pids.items():
        theirs = placement(pid) if pid is not None else None
        if theirs is None:
            continue
        if theirs.session == mine.session or (
            theirs.autogroup is not None and theirs.autogroup == mine.autogroup
        ):
            lines.append(
                f"{name} (pid {pid}) runs in this benchmark's session or CPU autogroup: "
                "its round trips are favoured over a broker's in a group of its own; "
                "start every broker with setsid"
            )
    return lines
