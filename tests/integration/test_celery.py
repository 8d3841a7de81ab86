"""Celery 5 end to end on the broker (issue 30, item 6): real workers (subprocesses of
`python -m celery`, the application of `benchmarks/celery_app.py`: acks_late, a prefetch
multiplier, `rpc://` results) and a real caller over kombu and py-amqp.

Tasks run and their results come back over the caller's reply queue, retries go back
through the broker, and with acks_late the tasks a killed worker held unacknowledged are
delivered again, marked redelivered, to the next worker."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from celery import Celery
from celery.result import ResultSet

from benchmarks.celery_app import ADD, FLAKY_ADD, SLOW_ADD, make_app
from benchmarks.celery_tasks import Workers, WorkerSettings, collect, send_tasks
from tests.integration.conftest import RunningBroker

RESULT_TIMEOUT_S = 30.0
"""Worker start-up (Celery's imports) on a loaded machine included."""
UNACKED_TIMEOUT_S = 30.0
POLL_S = 0.05
SLOW_TASK_S = 2.5  # well past the poll that sees both tasks taken, on a loaded machine
QUEUE = "celery-e2e"


def url(broker: RunningBroker) -> str:
    return f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}//"


@pytest.fixture
def caller(broker: RunningBroker) -> Iterator[Celery]:
    celery = make_app(url(broker), QUEUE, prefetch_multiplier=1)
    yield celery
    celery.close()


def start_workers(
    broker: RunningBroker, tmp_path: Path, pool: str, prefetch_multiplier: int
) -> Workers:
    settings = WorkerSettings(pool, concurrency=2, prefetch_multiplier=prefetch_multiplier)
    return Workers(url(broker), QUEUE, settings, tmp_path)


def unacked(broker: RunningBroker) -> int:
    status, body, _ = broker.http("GET", f"/api/queues/%2f/{quote(QUEUE, safe='')}")
    if status != 200:
        return 0
    assert isinstance(body, dict)
    return int(body.get("messages_unacknowledged", 0))


@pytest.mark.timeout(120)
def test_tasks_and_retries_come_back_over_rpc(
    broker: RunningBroker, caller: Celery, tmp_path: Path
) -> None:
    workers = start_workers(broker, tmp_path, "threads", prefetch_multiplier=4)
    try:
        results = [caller.send_task(ADD, (index, 1)) for index in range(200)]
        # Each fails once, and its retry is a new publish through the broker.
        retried = [caller.send_task(FLAKY_ADD, (index, 2, 1)) for index in range(10)]
        assert ResultSet(results).get(timeout=RESULT_TIMEOUT_S) == [i + 1 for i in range(200)]
        assert ResultSet(retried).get(timeout=RESULT_TIMEOUT_S) == [i + 2 for i in range(10)]
        workers.check_alive()
    finally:
        workers.stop()


@pytest.mark.timeout(120)
def test_windowed_send_reads_results_while_sending(
    broker: RunningBroker, caller: Celery, tmp_path: Path
) -> None:
    """The benchmark's send loop with a window: when it returns, every result but the
    last `window` is back already (read while sending), and all are right."""
    workers = start_workers(broker, tmp_path, "threads", prefetch_multiplier=4)
    count, window = 120, 10
    try:
        results = send_tasks(caller, count, retry_every=30, window=window, timeout_s=60.0)
        assert all(result.ready() for result in results[: count - window])
        collect(results, RESULT_TIMEOUT_S, workers)  # raises on a missing or wrong value
    finally:
        workers.stop()


@pytest.mark.timeout(120)
def test_prefork_pool_runs_tasks(broker: RunningBroker, caller: Celery, tmp_path: Path) -> None:
    workers = start_workers(broker, tmp_path, "prefork", prefetch_multiplier=2)
    try:
        results = [caller.send_task(ADD, (index, index)) for index in range(50)]
        assert ResultSet(results).get(timeout=RESULT_TIMEOUT_S) == [2 * i for i in range(50)]
    finally:
        workers.stop()


@pytest.mark.timeout(120)
def test_acks_late_tasks_of_a_killed_worker_are_redelivered(
    broker: RunningBroker, caller: Celery, tmp_path: Path
) -> None:
    # Prefetch multiplier 1 and two threads: the worker holds two tasks, both running.
    first = start_workers(broker, tmp_path / "first", "threads", prefetch_multiplier=1)
    # Tasks 0 and 1 are the ones the first worker takes; 2 and 3, never delivered
    # before the kill, need not be slow.
    seconds = [SLOW_TASK_S, SLOW_TASK_S, 0.0, 0.0]
    results = [caller.send_task(SLOW_ADD, (index, 10, seconds[index])) for index in range(4)]
    try:
        deadline = time.monotonic() + UNACKED_TIMEOUT_S
        while unacked(broker) < 2:
            first.check_alive()
            assert time.monotonic() < deadline, "the worker never took two tasks"
            time.sleep(POLL_S)
    finally:
        first.kill()  # in the middle of both tasks: no ack was sent
    second = start_workers(broker, tmp_path / "second", "threads", prefetch_multiplier=1)
    try:
        values = ResultSet(results).get(timeout=RESULT_TIMEOUT_S)
    finally:
        second.stop()
    assert [value for value, _ in values] == [index + 10 for index in range(4)]
    # The two the killed worker held come back redelivered; the two it never saw do not.
    assert [redelivered for _, redelivered in values] == [True, True, False, False]
