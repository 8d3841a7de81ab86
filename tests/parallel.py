"""How the suite is spread over pytest-xdist's workers (`-n`, pyproject's addopts): which
tests run together on one worker, and in what order the work is handed out.

A unit of work is a test file, so that a module-scoped fixture (a broker with TLS, a
RabbitMQ with the stream plugin, a data directory made once) starts once. Tests that use
one of the session's expensive fixtures (SHARED_FIXTURES: RabbitMQ with its plugins,
the SparkSession) form one unit across files, so each of those starts on one worker
only. Units go out longest first (LPT scheduling), by the time each took in the last
run on this checkout (pytest's cache), else by a guess (MEASURED_S), so that no long file
starts last while the other workers idle.

`pytest -n 0` runs everything serially in one process, as before (for a debugger).
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from typing import Final

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadScopeScheduling
from xdist.workermanage import WorkerController

# Session fixtures (tests/conftest.py and the per-directory conftests) that cost a
# process of seconds to start: the tests that use one run on one worker, together.
SHARED_FIXTURES: Final = {"rabbitmq_links": "rabbitmq", "spark": "spark"}
# Where each unit's time of the last run is kept (pytest's cache, .pytest_cache/).
DURATIONS_KEY: Final = "streamq/unit-durations"
# A unit's guessed time when the cache has none (a fresh clone): the suite's mean time
# per test, except for the units measured to take much longer (seconds, serial, on the
# 2-core development VM). One of those starting last would make the run that much longer.
SECONDS_PER_TEST_GUESS: Final = 0.37
MEASURED_S: Final = {
    "tests/cluster/test_failover.py": 150.0,
    "tests/faults/test_faults.py": 95.0,
    "rabbitmq": 120.0,
    "tests/integration/test_crash_amqp.py": 50.0,
    "tests/cluster/test_catchup.py": 40.0,
    "tests/integration/test_c_sanitizers.py": 35.0,
    "tests/integration/test_bit_rot.py": 40.0,
    "tests/integration/test_log_kill.py": 40.0,
}


def mark_groups(items: list[pytest.Item]) -> None:
    """An xdist_group mark on each test that uses a shared session fixture (xdist's
    loadgroup then adds `@group` to its id); the others are grouped by file."""
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        for fixture, group in SHARED_FIXTURES.items():
            if fixture in fixtures:
                item.add_marker(pytest.mark.xdist_group(group))


def unit_of(nodeid: str) -> str:
    """The unit of work of a test id: its xdist group, else its file."""
    if nodeid.rfind("@") > nodeid.rfind("]"):
        return nodeid.rsplit("@", 1)[1]
    return nodeid.split("::", 1)[0]


class FileGroupScheduling(LoadScopeScheduling):
    """xdist's loadscope with one unit per file or per xdist group, longest first."""

    def __init__(self, config: pytest.Config, log: Producer | None = None) -> None:
        super().__init__(config, log)
        self.durations = load_durations(config)
        self.ordered = False

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)

    def _assign_work_unit(self, node: WorkerController) -> None:
        """The first assignment puts the whole queue (made by `schedule`) in our order."""
        if not self.ordered:
            units = sorted(self.workqueue.items(), key=self._weight)
            self.workqueue = OrderedDict(units)
            self.ordered = True
        super()._assign_work_unit(node)

    def _weight(self, unit: tuple[str, dict[str, bool]]) -> float:
        """Sort key: minus the unit's expected seconds (the last run's, else a guess)."""
        name, tests = unit
        guess = MEASURED_S.get(name, len(tests) * SECONDS_PER_TEST_GUESS)
        return -self.durations.get(name, guess)


def load_durations(config: pytest.Config) -> dict[str, float]:
    cache = getattr(config, "cache", None)
    if cache is None:
        return {}
    stored = cache.get(DURATIONS_KEY, {})
    return {str(k): float(v) for k, v in stored.items()} if isinstance(stored, dict) else {}


class DurationRecorder:
    """On the controller: each unit's summed test time, stored in pytest's cache at the
    end of a run that ran the whole suite (a partial run keeps the old times)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[unit_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        cache = getattr(self.config, "cache", None)
        if cache is None or not self.seconds:
            return
        merged = load_durations(self.config)
        merged.update({unit: round(s, 2) for unit, s in self.seconds.items()})
        cache.set(DURATIONS_KEY, merged)
