"""streamq/progress.py: lines at most once per interval with counts, rate and ETA, and a
last line, driven by a clock the test moves (no sleeps)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from streamq import progress
from streamq.progress import Progress, duration_text


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def interval() -> Iterator[None]:
    before = progress.interval_s()
    progress.set_interval_s(10)
    yield
    progress.set_interval_s(before)


@pytest.fixture
def lines(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG, logger="streamq.test.progress")
    return caplog


LOGGER = logging.getLogger("streamq.test.progress")


@pytest.mark.usefixtures("interval")
def test_one_line_per_interval_with_counts_rate_and_eta(lines: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    work = Progress(LOGGER, "recovery", 100, "segments", clock=clock)
    for _ in range(10):
        clock.now += 1
        work.step()
    assert [r.getMessage() for r in lines.records] == [
        "recovery: 10 of 100 segments (10%), 1.0 segments/s, ETA 1m30s"
    ]
    numbers = lines.records[0].__dict__["progress"]
    assert numbers == {
        "done": 10, "total": 100, "unit": "segments", "elapsed_s": 10.0, "eta_s": 90.0,
    }  # fmt: skip
    for _ in range(9):  # within the next interval: quiet
        clock.now += 1
        work.step()
    assert len(lines.records) == 1
    clock.now += 1
    work.step(81)
    clock.now += 0.5
    work.finish()
    assert [r.getMessage() for r in lines.records[1:]] == [
        "recovery: 100 of 100 segments (100%), 5.0 segments/s, ETA 0s",
        "recovery: 100 of 100 segments done in 20s",
    ]
    assert lines.records[-1].levelno == logging.INFO


@pytest.mark.usefixtures("interval")
def test_short_work_logs_its_last_line_at_debug_only(lines: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    work = Progress(LOGGER, "import", 3, "items", clock=clock, fields={"vhost": "/"})
    work.step(3)
    work.finish()
    (last,) = lines.records
    assert last.levelno == logging.DEBUG
    assert last.getMessage() == "import: 3 of 3 items done in 0s"
    assert last.__dict__["vhost"] == "/"


def test_interval_zero_logs_every_step(lines: pytest.LogCaptureFixture) -> None:
    before = progress.interval_s()
    progress.set_interval_s(0)
    try:
        work = Progress(LOGGER, "sync", 0, "files", clock=Clock())
        work.step()
        work.step()
    finally:
        progress.set_interval_s(before)
    # No total known: no percentage; no time passed: no rate and no ETA.
    assert [r.getMessage() for r in lines.records] == ["sync: 1 of 0 files", "sync: 2 of 0 files"]
    with pytest.raises(ValueError, match="not negative"):
        progress.set_interval_s(-1)


def test_durations() -> None:
    assert [duration_text(s) for s in (0, 42.4, 187, 7500)] == ["0s", "42s", "3m07s", "2h05m"]
