"""A node's wall clock under the fault suite (tests/faults/clock.py): its readings map
back to host time across steps forward and back, as the writes tenures need."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.faults.clock import NodeClock
from tests.faults.nemesis import CLOCK_STEP_S


@pytest.mark.parametrize("step_s", [CLOCK_STEP_S, -CLOCK_STEP_S])
def test_a_reading_maps_back_to_host_time_across_a_step(tmp_path: Path, step_s: int) -> None:
    clock = NodeClock(tmp_path / "n1.clock")
    before = time.time()
    assert clock.host_time(before) == pytest.approx(before, abs=1e-6)
    clock.step(step_s)
    after = time.time()
    assert (tmp_path / "n1.clock").read_text() == f"{step_s:+d}\n"
    assert clock.host_time(after + step_s) == pytest.approx(after, abs=1e-6)
    clock.step(0)
    back = time.time()
    assert clock.host_time(back) == pytest.approx(back, abs=1e-6)
    assert clock.host_time(before) == pytest.approx(before, abs=1e-6)
