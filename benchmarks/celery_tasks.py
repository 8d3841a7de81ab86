"""Celery end to end (issue 30, item 6): tasks per second through two or three brokers.

Usage: python benchmarks/celery_tasks.py URL_A [URL_B [URL_C]] [--names A,B,C]
           [--tasks N] [--pool threads|prefork|both] [--concurrency N] [--workers N]
           [--prefetch-multiplier N] [--retry-every N] [--repetitions N] [--json FILE]
           [--pids PID_A,PID_B,PID_C] [--window N]

For each pool and repetition, and each broker in turn (A B C A B C), this starts
`--workers` Celery workers (`benchmarks/celery_app.py`: acks_late, the prefetch
multiplier, `rpc://` results) as subprocesses against that broker's URL on a queue of
the run's own, waits until a first task comes back, then sends `--tasks` tasks from one
producer (every `--retry-every`-th one fails once and is retried through the broker),
reading the results back while it sends once `--window` of them are outstanding,
waits for every result (bounded by `--timeout-s`), checks each value and reports
tasks/s from the first send to the last result, and the CPU time per task of the
broker (with `--pids`), the workers and the caller over that span. It then stops its
workers by their pids and deletes the run's queue. The load average is read before each
run. It never starts or stops a broker. With `--pids`, it warns (on stderr and below the
tables) about a broker that runs in its own session or CPU autogroup, which favours that
broker's round trips (`benchmarks/sched_groups.py`): start every broker with `setsid`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kombu
from celery import Celery
from celery.exceptions import TimeoutError as CeleryTimeout
from celery.result import AsyncResult, ResultSet

from benchmarks.celery_app import (
    ADD,
    BROKER_ENV,
    FLAKY_ADD,
    PREFETCH_ENV,
    QUEUE_ENV,
    make_app,
)
from benchmarks.sched_groups import shared_with_caller

REPO: Final = Path(__file__).resolve().parents[1]
DEFAULT_TASKS: Final = 100_000
DEFAULT_CONCURRENCY: Final = 2
DEFAULT_PREFETCH: Final = 4
DEFAULT_RETRY_EVERY: Final = 100
DEFAULT_WINDOW: Final = 1000
"""Results outstanding at most while sending. A caller that reads none of its results
until it has sent every task leaves them in its socket: RabbitMQ then closes its
connection after its 15 s `send_timeout` (`{writer,send_failed,{error,timeout}}`), the
auto-delete reply queue goes with it and the rest of the results are dropped as
unroutable (the 20,000- and 100,000-task runs that never finished on RabbitMQ)."""
TASK_RATE_MIN: Final = 20.0
"""Slowest task rate the default timeout allows before a run counts as failed."""
TIMEOUT_MARGIN_S: Final = 120.0
WORKER_START_TIMEOUT_S: Final = 120.0
"""From starting the workers to the first task's result: Celery's imports are slow."""
WORKER_STOP_TIMEOUT_S: Final = 30.0
PAUSE_S: Final = 2.0
LOG_TAIL_BYTES: Final = 2000
_CLOCK_TICKS: Final = os.sysconf("SC_CLK_TCK")
_MS_PER_S: Final = 1000.0


@dataclass(frozen=True, slots=True)
class Outcome:
    broker: str
    pool: str
    repetition: int
    tasks: int
    seconds: float
    send_seconds: float
    tasks_per_s: float
    load_average: tuple[float, float, float]
    # CPU seconds per 1,000 tasks over the timed part: the broker's (None without its
    # pid), the workers' (with their pool children) and this caller's.
    broker_cpu_ms_per_task: float | None
    worker_cpu_ms_per_task: float
    caller_cpu_ms_per_task: float


class RunError(Exception):
    """A run that did not finish: its workers died, or results were missing or wrong."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("urls", nargs="+", help="AMQP URLs, e.g. amqp://guest:guest@h:5672//")
    parser.add_argument("--names", help="comma-separated names of the brokers (default A,B,C)")
    parser.add_argument("--tasks", type=int, default=DEFAULT_TASKS)
    parser.add_argument("--pool", choices=("threads", "prefork", "both"), default="threads")
    parser.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY)
    parser.add_argument("--workers", type=int, default=1, help="worker processes per run")
    parser.add_argument("--prefetch-multiplier", type=int, default=DEFAULT_PREFETCH)
    parser.add_argument(
        "--retry-every", type=int, default=DEFAULT_RETRY_EVERY, help="0: no retries"
    )
    parser.add_argument("--repetitions", type=int, default=1)
    parser.add_argument(
        "--window",
        type=int,
        default=DEFAULT_WINDOW,
        help="results outstanding at most while sending (0: read none until all are sent)",
    )
    parser.add_argument("--timeout-s", type=float, help="per run; default from --tasks")
    parser.add_argument(
        "--pids", help="comma-separated pids of the brokers, in URL order, for their CPU time"
    )
    parser.add_argument("--json", type=Path, help="also write every outcome to this file")
    args = parser.parse_args(argv)
    names = args.names.split(",") if args.names else ["A", "B", "C"][: len(args.urls)]
    if len(names) != len(args.urls) or len(set(names)) != len(names):
        parser.error("--names needs one distinct name per URL")
    args.names = names
    pids = [int(pid) if pid else None for pid in args.pids.split(",")] if args.pids else []
    args.pids = (pids + [None] * len(names))[: len(names)]
    return args


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    pool: str
    concurrency: int
    prefetch_multiplier: int
    count: int = 1


class Workers:
    """`settings.count` Celery worker processes on `url` and `queue`, each in its own
    session, so stopping one signals only its process group (the worker and its pool
    children)."""

    def __init__(self, url: str, queue: str, settings: WorkerSettings, log_dir: Path) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, BROKER_ENV: url, QUEUE_ENV: queue}
        env[PREFETCH_ENV] = str(settings.prefetch_multiplier)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
        self.logs = [log_dir / f"{queue}-worker{index}.log" for index in range(settings.count)]
        self.processes = [
            self._start(settings, env, index, log) for index, log in enumerate(self.logs)
        ]

    @staticmethod
    def _start(
        settings: WorkerSettings, env: dict[str, str], index: int, log: Path
    ) -> subprocess.Popen[bytes]:
        command = [sys.executable, "-m", "celery", "-A", "benchmarks.celery_app", "worker"]
        command += ["--pool", settings.pool, "--concurrency", str(settings.concurrency)]
        command += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
        command += ["--loglevel", "WARNING", "--hostname", f"bench{index}-{os.getpid()}@%h"]
        with log.open("wb") as output:
            return subprocess.Popen(
                command, cwd=REPO, env=env, stdout=output, stderr=output, start_new_session=True
            )

    def kill(self) -> None:
        """SIGKILL each worker's process group (the group this script made), no shutdown."""
        for process in self.processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(WORKER_STOP_TIMEOUT_S)

    def check_alive(self) -> None:
        for process, log in zip(self.processes, self.logs, strict=True):
            if process.poll() is not None:
                tail = log.read_bytes()[-LOG_TAIL_BYTES:].decode(errors="replace")
                raise RunError(f"worker exited with {process.returncode}: {tail}")

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(WORKER_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)  # the group this script made
                process.wait(WORKER_STOP_TIMEOUT_S)


def cpu_seconds(pid: int | None) -> float:
    """User plus system CPU time of process `pid` and its reaped children so far (0.0
    without a pid or when it is gone), from /proc/PID/stat."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # Fields 14-17 of proc(5) (utime, stime, cutime, cstime), counted after the ")".
    return sum(int(value) for value in fields[11:15]) / _CLOCK_TICKS


def group_cpu_seconds(pids: list[int]) -> float:
    """`cpu_seconds` of `pids` and of their live children (a prefork pool's)."""
    total = 0.0
    for pid in pids:
        total += cpu_seconds(pid)
        for task in Path(f"/proc/{pid}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                total += sum(cpu_seconds(int(child)) for child in task.read_text().split())
    return total


def wait_first_result(celery: Celery, workers: Workers) -> None:
    """Send one task and wait until a worker answers it. Raises `RunError`."""
    deadline = time.monotonic() + WORKER_START_TIMEOUT_S
    result = celery.send_task(ADD, (1, 2))
    while time.monotonic() < deadline:
        workers.check_alive()
        with contextlib.suppress(CeleryTimeout):
            if result.get(timeout=1.0) == 3:
                return
    raise RunError(f"no worker answered within {WORKER_START_TIMEOUT_S:.0f} s")


def send_tasks(
    celery: Celery, count: int, retry_every: int, window: int, timeout_s: float
) -> list[AsyncResult]:
    """`count` tasks over one producer; every `retry_every`-th is a flaky_add that fails
    once. With `window`, before each send past the first `window` it waits for the result
    sent `window` tasks earlier (which reads every result that came meanwhile). Raises
    `RunError` if that takes longer than what is left of `timeout_s`."""
    results: list[AsyncResult] = []
    deadline = time.monotonic() + timeout_s
    with celery.producer_or_acquire() as producer:
        for index in range(count):
            if window and index >= window:
                try:
                    results[index - window].get(timeout=deadline - time.monotonic())
                except CeleryTimeout:
                    raise RunError(f"result {index - window:,} not back in time") from None
            if retry_every and index % retry_every == 0:
                results.append(celery.send_task(FLAKY_ADD, (index, 1, 1), producer=producer))
            else:
                results.append(celery.send_task(ADD, (index, 1), producer=producer))
    return results


def collect(results: list[AsyncResult], timeout_s: float, workers: Workers) -> None:
    """Wait for every result and check each value. Raises `RunError`."""
    try:
        values = ResultSet(results).get(timeout=timeout_s, propagate=True)
    except CeleryTimeout:
        workers.check_alive()
        done = sum(1 for result in results if result.ready())
        raise RunError(f"{done:,} of {len(results):,} results within {timeout_s:.0f} s") from None
    wrong = [index for index, value in enumerate(values) if value != index + 1]
    if wrong:
        raise RunError(f"{len(wrong)} wrong results, first for task {wrong[0]}")


def run_once(
    url: str,
    name: str,
    pid: int | None,
    pool: str,
    repetition: int,
    args: argparse.Namespace,
    log_dir: Path,
) -> Outcome:
    queue = f"celery-bench-{os.getpid()}-{name}-{pool}-{repetition}"
    celery = make_app(url, queue, args.prefetch_multiplier)
    load = os.getloadavg()
    settings = WorkerSettings(pool, args.concurrency, args.prefetch_multiplier, args.workers)
    workers = Workers(url, queue, settings, log_dir)
    worker_pids = [process.pid for process in workers.processes]
    try:
        wait_first_result(celery, workers)
        timeout_s = args.timeout_s or args.tasks / TASK_RATE_MIN + TIMEOUT_MARGIN_S
        cpu_before = (cpu_seconds(pid), group_cpu_seconds(worker_pids), time.process_time())
        started = time.monotonic()
        results = send_tasks(celery, args.tasks, args.retry_every, args.window, timeout_s)
        sent = time.monotonic()
        collect(results, timeout_s - (sent - started), workers)
        seconds = time.monotonic() - started
        cpu_after = (cpu_seconds(pid), group_cpu_seconds(worker_pids), time.process_time())
    finally:
        workers.stop()
        delete_queue(url, queue)
        celery.close()
    broker_ms, worker_ms, caller_ms = (
        (after - before) * _MS_PER_S / args.tasks
        for before, after in zip(cpu_before, cpu_after, strict=True)
    )
    return Outcome(
        name,
        pool,
        repetition,
        args.tasks,
        seconds,
        sent - started,
        args.tasks / seconds,
        load,
        broker_ms if pid is not None else None,
        worker_ms,
        caller_ms,
    )


def delete_queue(url: str, queue: str) -> None:
    try:
        with kombu.Connection(url, connect_timeout=10) as connection:
            connection.default_channel.queue_delete(queue)
    except Exception as exc:  # the report goes on; the queue is the broker's to keep
        print(f"warning: deleting {queue}: {exc}", file=sys.stderr)


def table(outcomes: list[Outcome], names: list[str], pools: list[str]) -> str:
    """Median tasks/s per pool and broker, and the first broker's ratio to the others."""
    head = "| pool | " + " | ".join(names) + "".join(f" | {names[0]}/{n}" for n in names[1:])
    lines = [head + " |", "|---" * (2 * len(names)) + "|"]
    for pool in pools:
        medians = []
        for name in names:
            rates = [o.tasks_per_s for o in outcomes if o.pool == pool and o.broker == name]
            medians.append(statistics.median(rates) if rates else None)
        cells = [f"{rate:,.0f}" if rate else "n/a" for rate in medians]
        first = medians[0]
        ratios = [f"{first / rate:.2f}x" if first and rate else "n/a" for rate in medians[1:]]
        lines.append(f"| {pool} | " + " | ".join(cells + ratios) + " |")
    return "\n".join(lines)


def cpu_table(outcomes: list[Outcome], names: list[str], pools: list[str]) -> str:
    """Median CPU milliseconds per task of the broker, the workers and the caller."""
    lines = ["| pool | broker | CPU ms/task: broker | workers | caller |", "|---" * 5 + "|"]
    for pool in pools:
        for name in names:
            mine = [o for o in outcomes if o.pool == pool and o.broker == name]
            if not mine:
                continue
            brokers = [o.broker_cpu_ms_per_task for o in mine if o.broker_cpu_ms_per_task]
            cells = [
                f"{statistics.median(brokers):.2f}" if brokers else "n/a",
                f"{statistics.median(o.worker_cpu_ms_per_task for o in mine):.2f}",
                f"{statistics.median(o.caller_cpu_ms_per_task for o in mine):.2f}",
            ]
            lines.append(f"| {pool} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    pools = ["threads", "prefork"] if args.pool == "both" else [args.pool]
    outcomes: list[Outcome] = []
    failures: list[str] = []
    placement_warnings = shared_with_caller(dict(zip(args.names, args.pids, strict=True)))
    for warning in placement_warnings:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="celery-bench-") as log_dir:
        for pool in pools:
            for repetition in range(1, args.repetitions + 1):
                for url, name, pid in zip(args.urls, args.names, args.pids, strict=True):
                    try:
                        outcome = run_once(url, name, pid, pool, repetition, args, Path(log_dir))
                    except RunError as exc:
                        failures.append(f"{pool} #{repetition} {name}: {exc}")
                        print(f"{failures[-1]}", file=sys.stderr, flush=True)
                        continue
                    outcomes.append(outcome)
                    print(json.dumps(asdict(outcome)), file=sys.stderr, flush=True)
                    time.sleep(PAUSE_S)
    print(table(outcomes, args.names, pools))
    print()
    print(cpu_table(outcomes, args.names, pools))
    for failure in failures:
        print(f"- failed: {failure}")
    for warning in placement_warnings:
        print(f"- warning: {warning}")
    if args.json:
        args.json.write_text(json.dumps([asdict(o) for o in outcomes], indent=2) + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
