"""How the suite is spread over pytest-xdist's workers (`-n`, pyproject's addopts): which
tests run together on one worker, and in what order the work is handed out.

A unit of work is a test file, so that a module-scoped fixture (a broker with TLS, a
RabbitMQ with the stream plugin, a data directory made once) starts once. The tests that
use one of the session's expensive fixtures (SHARED_FIXTURES: RabbitMQ with its plugins,
the SparkSession) form one unit across files, so each of those starts on one worker only.
Units go out longest first (LPT scheduling), by the time their files took in the last run
on this checkout (pytest's cache), else by a guess (MEASURED_S), so that no long file
starts last while the other workers idle.

xdist's own `xdist_group` marks do not work with pytest 9.2 (xdist 3.8 renames the test
through `item._nodeid`, which pytest no longer reads), and the controller collects
nothing itself: so each worker writes the groups it found to a file named after the
run (groups_path), read by the controller's scheduler once every worker has collected.

`pytest -n 0` runs everything serially in one process, as before (for a debugger).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections import OrderedDict, defaultdict
from pathlib import Path
from typing import Final

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadScopeScheduling
from xdist.workermanage import WorkerController

# Session fixtures (tests/conftest.py and the per-directory conftests) that cost a
# process of seconds to start: the tests that use one run on one worker, together.
SHARED_FIXTURES: Final = {"rabbitmq_links": "rabbitmq", "spark": "spark"}
# Where each file's time of the last run is kept (pytest's cache, .pytest_cache/).
DURATIONS_KEY: Final = "streamq/file-durations"
# A file's guessed time when the cache has none (a fresh clone): the mean time per test of
# the other files, except for the files measured to take 20 s or more (seconds, in a
# 5-worker run from a fresh clone on the 2-core development VM; test_shovels_kill.py's
# scaled to its halved transfer). One of those starting last would make the whole run
# that much longer.
SECONDS_PER_TEST_GUESS: Final = 0.4
MEASURED_S: Final = {
    "tests/cluster/test_failover.py": 155.0,
    "tests/differential/test_scenarios.py": 108.0,
    "tests/faults/test_faults.py": 107.0,
    "tests/integration/test_crash_amqp.py": 73.0,
    "tests/cluster/test_catchup.py": 59.0,
    "tests/integration/test_c_sanitizers.py": 58.0,
    "tests/integration/test_shovels_kill.py": 48.0,
    "tests/stream/test_offset_durability.py": 47.0,
    "tests/integration/test_dlx_at_least_once.py": 46.0,
    "tests/spark/test_spark_source.py": 42.0,
    "tests/integration/test_celery.py": 38.0,
    "tests/integration/test_log_kill.py": 35.0,
    "tests/cluster/test_stream_replicas.py": 34.0,
    "tests/integration/test_config_file.py": 33.0,
    "tests/spark/test_spark_follower.py": 33.0,
    "tests/cluster/test_cluster_tls.py": 32.0,
    "tests/fuzz/test_amqp_frames.py": 31.0,
    "tests/packaging/test_wheel.py": 31.0,
    "tests/integration/test_bit_rot.py": 31.0,
    "tests/differential/test_random_deliveries.py": 30.0,
    "tests/integration/test_ctl.py": 28.0,
    "tests/differential/test_random.py": 26.0,
    "tests/mqtt/test_gateway_rabbitmq.py": 26.0,
    "tests/cluster/test_rolling_upgrade.py": 24.0,
    "tests/integration/test_disk_faults.py": 24.0,
    "tests/integration/test_transports.py": 24.0,
    "tests/browser/test_ui_admin.py": 23.0,
    "tests/cluster/test_membership.py": 23.0,
    "tests/integration/test_stream_runs.py": 22.0,
    "tests/integration/test_federation.py": 22.0,
    "tests/unit/log/test_amqp10_c.py": 21.0,
    "tests/integration/test_bit_rot_random.py": 21.0,
    "tests/mqtt/test_gateway_websocket_rabbitmq.py": 20.0,
}


def groups_path(testrunuid: str) -> Path:
    """Where the workers of run `testrunuid` leave {test id: group}."""
    return Path(tempfile.gettempdir()) / f"streamq-xdist-groups-{testrunuid}.json"


def mark_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a worker: {test id: group} for the tests that use a shared session fixture,
    written for the controller (replaced whole: every worker collects the same)."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return
    groups = {}
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        for fixture, group in SHARED_FIXTURES.items():
            if fixture in fixtures:
                groups[item.nodeid] = group
    path = groups_path(workerinput["testrunuid"])
    partial = path.with_name(f"{path.name}.{workerinput['workerid']}")
    partial.write_text(json.dumps(groups))
    os.replace(partial, path)


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


class FileGroupScheduling(LoadScopeScheduling):
    """xdist's loadscope with one unit per file or per group, longest first."""

    def __init__(self, config: pytest.Config, log: Producer | None = None) -> None:
        super().__init__(config, log)
        self.durations = load_durations(config)
        self.groups: dict[str, str] = {}  # test id: group, from the workers
        self.ordered = False

    def schedule(self) -> None:
        if self.collection is None and self.collection_is_completed:
            self.groups = self._read_groups()
        super().schedule()

    def _read_groups(self) -> dict[str, str]:
        """The workers' groups (none if they wrote none: every unit is then a file)."""
        node: WorkerController = self.nodes[0]
        path = groups_path(node.workerinput["testrunuid"])
        try:
            groups = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        with contextlib.suppress(OSError):
            path.unlink()
        return {str(k): str(v) for k, v in groups.items()}

    def _split_scope(self, nodeid: str) -> str:
        return self.groups.get(nodeid, file_of(nodeid))

    def _assign_work_unit(self, node: WorkerController) -> None:
        """The first assignment puts the whole queue (made by `schedule`) in our order."""
        if not self.ordered:
            sizes: dict[str, int] = defaultdict(int)
            for nodeid in self.collection or ():
                sizes[file_of(nodeid)] += 1
            units = sorted(
                self.workqueue.items(), key=lambda u: self._expected_s(u[1], sizes), reverse=True
            )
            self.workqueue = OrderedDict(units)
            self.ordered = True
        super()._assign_work_unit(node)

    def _expected_s(self, tests: dict[str, bool], sizes: dict[str, int]) -> float:
        """A unit's expected time: its files' last times (or guesses), shared per test
        where a unit has only some of a file's tests."""
        per_file: dict[str, int] = defaultdict(int)
        for nodeid in tests:
            per_file[file_of(nodeid)] += 1
        total = 0.0
        for name, count in per_file.items():
            guess = MEASURED_S.get(name, sizes[name] * SECONDS_PER_TEST_GUESS)
            total += self.durations.get(name, guess) * count / sizes[name]
        return total


def load_durations(config: pytest.Config) -> dict[str, float]:
    cache = getattr(config, "cache", None)
    if cache is None:
        return {}
    stored = cache.get(DURATIONS_KEY, {})
    return {str(k): float(v) for k, v in stored.items()} if isinstance(stored, dict) else {}


class DurationRecorder:
    """On the controller (or a serial run): each file's summed test time, kept in
    pytest's cache; a run of some files only updates those files' times."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[file_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        cache = getattr(self.config, "cache", None)
        if cache is None or not self.seconds:
            return
        merged = load_durations(self.config)
        merged.update({name: round(s, 2) for name, s in self.seconds.items()})
        cache.set(DURATIONS_KEY, merged)
