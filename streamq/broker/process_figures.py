"""The broker process's own figures, measured when asked, for `/api/nodes`.

Owns the readings that stand where RabbitMQ reports its Erlang VM's figures: open file
descriptors and their limit, threads and asyncio tasks (streamq's "processes"), threads
ready to run (the scheduler's run queue) and the processors the process may use. Each is
read from the kernel (`/proc/self`, `getrlimit`, `sched_getaffinity`) at the time of the
call, never cached; where the reading is not available (no `/proc`, an unlimited limit)
the function returns None and the API omits the field rather than show a made-up number.
Costs one directory listing or a few small reads per call: management requests only,
never the message path. It knows nothing of queues, clients or the event loop's owner.
"""

from __future__ import annotations

import os
import resource
import threading
from typing import Final

PROC_SELF: Final = "/proc/self"
# Field 3 of /proc/<pid>/task/<tid>/stat, after the parenthesised command name: "R" is
# running or runnable (on a CPU or waiting in the kernel's run queue for one).
RUNNABLE_STATE: Final = "R"


def fd_used() -> int | None:
    """Open file descriptors of the process (sockets, segment files, pipes...), not
    counting the one this listing opens; None without /proc."""
    try:
        return len(os.listdir(f"{PROC_SELF}/fd")) - 1
    except OSError:
        return None


def fd_total() -> int | None:
    """The soft limit on open file descriptors (RLIMIT_NOFILE); None when unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def thread_count() -> int:
    """The process's threads, those not started by Python included (/proc/self/task),
    or Python's own count without /proc."""
    try:
        return len(os.listdir(f"{PROC_SELF}/task"))
    except OSError:
        return threading.active_count()


def _thread_state(tid: str) -> str | None:
    try:
        with open(f"{PROC_SELF}/task/{tid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None  # the thread ended meanwhile
    # The command name may hold spaces and parentheses: the state follows the last ")".
    rest = stat[stat.rfind(")") + 2 :]
    return rest[:1] or None


def runnable_threads() -> int | None:
    """Threads of the process that are ready to run, the calling one left out (it is
    running to answer): the nearest equivalent of the Erlang VM's run queue, work waiting
    for a CPU. None without /proc."""
    try:
        tids = os.listdir(f"{PROC_SELF}/task")
    except OSError:
        return None
    me = str(threading.get_native_id())
    return sum(1 for tid in tids if tid != me and _thread_state(tid) == RUNNABLE_STATE)


def processors() -> int:
    """The CPUs the process may run on (its affinity mask, what a container grants)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
