"""benchmarks/sched_groups.py: a broker in the benchmark's session or autogroup is named,
one in a session of its own is not (real child processes, read from /proc)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from benchmarks.sched_groups import placement, shared_with_caller

_WAIT_S = 10.0


@contextmanager
def child(*, new_session: bool) -> Iterator[int]:
    """A sleeping Python child, in this session or a new one; stopped by its pid."""
    process = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=new_session
    )
    try:
        yield process.pid
    finally:
        process.kill()
        process.wait(_WAIT_S)


def test_placement_reads_the_session_of_a_process() -> None:
    mine = placement(os.getpid())
    assert mine is not None
    assert mine.session == os.getsid(0)
    with child(new_session=True) as pid:
        theirs = placement(pid)
        assert theirs is not None
        assert theirs.session == pid  # the leader of its new session
        if mine.autogroup is not None:
            assert theirs.autogroup is not None
            assert theirs.autogroup != mine.autogroup


def test_a_broker_in_the_callers_session_is_named_and_one_on_its_own_is_not() -> None:
    with child(new_session=False) as same, child(new_session=True) as apart:
        lines = shared_with_caller({"near": same, "far": apart, "unknown": None})
    assert len(lines) == 1
    assert lines[0].startswith(f"near (pid {same}) runs in this benchmark's session")


def test_a_process_that_is_gone_is_skipped() -> None:
    with child(new_session=False) as pid:
        pass
    assert placement(pid) is None
    assert shared_with_caller({"gone": pid}) == []
