"""Compare two or three running AMQP brokers on the fixed matrix of the perf issue.

Usage: python benchmarks/compare.py URL_A URL_B [URL_C] [--pid-a PID] [--pid-b PID]
           [--pid-c PID] [--name-a NAME] [--name-b NAME] [--name-c NAME] [--quick]
           [--full] [--only KEYS] [--json FILE] [--streamq COMMAND]
           [--tls-url-a AMQPS_URL] [--tls-url-b AMQPS_URL] [--tls-url-c AMQPS_URL]
           [--stream-a HOST:PORT] [--stream-b HOST:PORT] [--stream-c HOST:PORT]

Runs every scenario of `benchmarks/scenarios.py` (and the queue-feature ones of
`benchmarks/queue_features.py`) against A and B (and C) in turn, A B C A B C, three
repetitions of 5 s (--quick: one of 2 s; the 1M-message fills stay 1M), and prints per
scenario the medians (for the memory scenarios the largest repetition, since later ones
reuse what earlier ones freed), the A/B ratio and whether A meets the target against B
(with C: also C's figure, A/C and its verdict, in the same table), then each broker's
peak RSS: sampled VmRSS during the runs and VmHWM at the end, from
/proc/PID/status, when the pids are given (the memory scenarios need them). The memory
scenarios run first, while the heaps are small; --full queues 10M messages instead of 1M.
A scenario that fails on a broker is reported as n/a with its reason; the comparison goes
on. The TLS rows (issue 20) run over each broker's --tls-url (an amqps:// URI with
`cacertfile`); below the tables, each broker's rate over TLS as a share of the same run over
TCP. `--streamq` names the command that provides `streamq perf` (default: the one in this
interpreter's venv), e.g. a wrapper around a frozen copy of the tree. With --stream-...,
the stream protocol's rows (issue 23, `benchmarks/stream_compare.py`) run in the same
matrix against each broker's stream port (n/a for a broker without one).
The request/reply rows (issue 30) are those of `benchmarks/request_reply.py`.

This script only drives the load generator (`streamq perf`) and pika; it never starts or
stops a broker. The brokers must run on this machine for the memory figures.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Final

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.admin import server_version
from benchmarks.compare_report import (
    Row,
    error_lines,
    format_value,
    markdown_table,
    row_summary,
    tls_lines,
)
from benchmarks.perf_process import ScenarioError, default_streamq
from benchmarks.queue_features import queue_feature_scenarios
from benchmarks.request_reply import request_reply_scenarios
from benchmarks.rss import RssSampler, read_status_kib
from benchmarks.scenarios import Broker, Run, Scenario, Settings, matrix
from benchmarks.sched_groups import shared_with_caller
from benchmarks.stream_compare import parse_address, stream_scenarios
from benchmarks.work_queues import work_queue_scenarios

DURATION_S: Final = 5
QUICK_DURATION_S: Final = 2
REPETITIONS: Final = 3
QUICK_REPETITIONS: Final = 1
CONSUME_COUNT: Final = 1_000_000
QUEUED_COUNT: Final = 1_000_000
FULL_QUEUED_COUNT: Final = 10_000_000
PAUSE_S: Final = 1.0
"""Between two runs, so the broker settles (deletes, fsyncs, GC) before the next one."""
_KIB_PER_MIB: Final = 1024


@dataclass
class Peaks:
    """The highest sampled VmRSS (KiB) per broker, overall and per scenario."""

    overall: dict[str, int] = field(default_factory=dict)
    by_scenario: dict[str, dict[str, int]] = field(default_factory=dict)

    def add(self, scenario: str, broker: str, peak_kib: int | None) -> None:
        if peak_kib is None:
            return
        self.overall[broker] = max(self.overall.get(broker, 0), peak_kib)
        per_broker = self.by_scenario.setdefault(scenario, {})
        per_broker[broker] = max(per_broker.get(broker, 0), peak_kib)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "url_a", help="AMQP URI of broker A, e.g. amqp://guest:guest@host:5672/%%2f"
    )
    parser.add_argument("url_b", help="AMQP URI of broker B")
    parser.add_argument("url_c", nargs="?", help="AMQP URI of an optional broker C")
    for side in "abc":
        parser.add_argument(
            f"--tls-url-{side}",
            help=f"amqps:// URI of broker {side.upper()} for the TLS rows, e.g. "
            "amqps://guest:guest@127.0.0.1:5671/%%2f?cacertfile=ca.pem",
        )
        parser.add_argument(
            f"--stream-{side}",
            type=parse_address,
            help=f"stream protocol port of broker {side.upper()}, e.g. 127.0.0.1:5552",
        )
    parser.add_argument("--pid-a", type=int, help="pid of broker A, for its RSS")
    parser.add_argument("--pid-b", type=int, help="pid of broker B, for its RSS")
    parser.add_argument("--pid-c", type=int, help="pid of broker C, for its RSS")
    parser.add_argument("--name-a", default="A", help="name of broker A in the tables")
    parser.add_argument("--name-b", default="B", help="name of broker B in the tables")
    parser.add_argument("--name-c", default="C", help="name of broker C in the tables")
    parser.add_argument(
        "--quick", action="store_true", help=f"{QUICK_DURATION_S} s runs, one repetition"
    )
    parser.add_argument(
        "--full", action="store_true", help=f"{FULL_QUEUED_COUNT:,} queued messages, not 1M"
    )
    parser.add_argument("--only", help="comma-separated scenario keys to run (default: all)")
    parser.add_argument("--json", type=Path, help="also write every value to this file")
    parser.add_argument("--streamq", default=default_streamq(), help="the streamq command")
    return parser.parse_args(argv)


def settings_from(args: argparse.Namespace) -> Settings:
    return Settings(
        duration_s=QUICK_DURATION_S if args.quick else DURATION_S,
        repetitions=QUICK_REPETITIONS if args.quick else REPETITIONS,
        consume_count=CONSUME_COUNT,
        queued_count=FULL_QUEUED_COUNT if args.full else QUEUED_COUNT,
        streamq=args.streamq,
    )


def select(scenarios: list[Scenario], only: str | None) -> list[Scenario]:
    """The scenarios named in `only` (comma-separated keys), or all. Raises `SystemExit`
    for an unknown key."""
    if not only:
        return scenarios
    keys = [key.strip() for key in only.split(",") if key.strip()]
    known = {scenario.key for scenario in scenarios}
    unknown = [key for key in keys if key not in known]
    if unknown:
        raise SystemExit(f"unknown scenario {', '.join(unknown)}; known: {', '.join(known)}")
    return [scenario for scenario in scenarios if scenario.key in keys]


def run_once(scenario: Scenario, run: Run, peaks: Peaks) -> dict[str, float] | str:
    """The scenario's metrics on one broker, or the reason it failed."""
    with RssSampler(run.broker.pid) as sampler:
        try:
            outcome: dict[str, float] | str = scenario.run(run)
        except ScenarioError as exc:
            outcome = str(exc)
        except Exception as exc:  # a client library's error: the run goes on
            outcome = f"{type(exc).__name__}: {exc}"
    peaks.add(scenario.key, run.broker.name, sampler.peak_kib)
    return outcome


def record(rows: list[Row], outcome: dict[str, float] | str, index: int) -> None:
    """Note one run's outcome on broker `index` (0 A, 1 B, 2 C) in each of its rows."""
    for row in rows:
        values, errors = row.side(index)
        if isinstance(outcome, str):
            errors.append(outcome)
        elif row.metric.key in outcome:
            values.append(outcome[row.metric.key])
        else:
            errors.append(f"no {row.metric.key} in the result")


def describe(outcome: dict[str, float] | str, rows: list[Row]) -> str:
    if isinstance(outcome, str):
        return f"failed: {outcome}"
    parts = [
        f"{row.metric.label} {format_value(outcome.get(row.metric.key), row.metric.unit)}"
        for row in rows
    ]
    return ", ".join(parts)


def run_scenario(
    scenario: Scenario, brokers: tuple[Broker, ...], settings: Settings, peaks: Peaks
) -> list[Row]:
    """Run one scenario A B (C) A B (C)... and collect every value."""
    rows = [Row(scenario.title, scenario.flags, metric) for metric in scenario.metrics]
    for repetition in range(1, settings.repetitions + 1):
        for index, broker in enumerate(brokers):
            tag = f"{scenario.key}-{broker.name.lower()}-{repetition}"
            outcome = run_once(scenario, Run(broker, settings, tag), peaks)
            record(rows, outcome, index)
            progress = f"{scenario.title} #{repetition} {broker.name}: {describe(outcome, rows)}"
            print(progress, file=sys.stderr, flush=True)
            time.sleep(PAUSE_S)
    return rows


def run_matrix(
    scenarios: list[Scenario], brokers: tuple[Broker, ...], settings: Settings, peaks: Peaks
) -> list[Row]:
    """Run the memory scenarios first, while the brokers' heaps are small (freed memory
    that a heap keeps is reused and hides the next allocations), and the idle reading
    last; return rows in matrix order."""
    rows_by_key: dict[str, list[Row]] = {}
    for scenario in sorted(scenarios, key=Scenario.order):
        rows_by_key[scenario.key] = run_scenario(scenario, brokers, settings, peaks)
    return [row for scenario in scenarios for row in rows_by_key[scenario.key]]


def memory_table(brokers: tuple[Broker, ...], peaks: Peaks, scenarios: list[Scenario]) -> str:
    """Peak sampled VmRSS per scenario and overall, and VmHWM now, in MiB."""
    names = [broker.name for broker in brokers]
    lines = ["| peak RSS | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for scenario in scenarios:
        per_broker = peaks.by_scenario.get(scenario.key, {})
        lines.append(_memory_line(scenario.title, [per_broker.get(name) for name in names]))
    overall = [peaks.overall.get(name) for name in names]
    lines.append(_memory_line("all runs (sampled VmRSS)", overall))
    hwm = [read_status_kib(broker.pid, "VmHWM") for broker in brokers]
    lines.append(_memory_line("since start (VmHWM)", hwm))
    return "\n".join(lines)


def _memory_line(title: str, values_kib: list[int | None]) -> str:
    return f"| {title} | " + " | ".join(_mib(value) for value in values_kib) + " |"


def _mib(kib: int | None) -> str:
    return "n/a" if kib is None else f"{kib / _KIB_PER_MIB:,.0f} MiB"


def environment(brokers: tuple[Broker, ...]) -> dict[str, object]:
    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "load_average": os.getloadavg(),
        "servers": {broker.name: server_version(broker.url) for broker in brokers},
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = settings_from(args)
    brokers = brokers_from(args)
    name_c = args.name_c if args.url_c else None
    every = (
        matrix(settings)
        + queue_feature_scenarios()
        + work_queue_scenarios()
        + request_reply_scenarios()
    )
    scenarios = select(every + streams(args), args.only)
    env = environment(brokers)
    print(json.dumps(env), file=sys.stderr)
    # A broker in this script's session or autogroup has its round trips favoured.
    placement_warnings = shared_with_caller({broker.name: broker.pid for broker in brokers})
    for warning in placement_warnings:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    peaks = Peaks()
    rows = run_matrix(scenarios, brokers, settings, peaks)
    print(markdown_table(rows, args.name_a, args.name_b, name_c))
    print()
    print(memory_table(brokers, peaks, scenarios))
    for line in error_lines(rows, args.name_a, args.name_b, name_c):
        print(f"- {line}")
    for line in tls_lines(rows, [broker.name for broker in brokers]):
        print(f"- {line}")
    for warning in placement_warnings:
        print(f"- warning: {warning}")
    if args.json:
        write_json(args.json, env, settings, rows, peaks)
    return 0


def streams(args: argparse.Namespace) -> list[Scenario]:
    """The stream protocol's scenarios when a stream port was given, keyed by name."""
    addresses = {
        getattr(args, f"name_{side}"): getattr(args, f"stream_{side}")
        for side in "abc"
        if getattr(args, f"stream_{side}") is not None
    }
    return stream_scenarios(addresses, args.quick) if addresses else []


def brokers_from(args: argparse.Namespace) -> tuple[Broker, ...]:
    """A and B, and C when its URL was given. Raises `SystemExit` for clashing names."""
    brokers = [
        Broker(args.name_a, args.url_a, args.pid_a, args.tls_url_a),
        Broker(args.name_b, args.url_b, args.pid_b, args.tls_url_b),
    ]
    if args.url_c:
        brokers.append(Broker(args.name_c, args.url_c, args.pid_c, args.tls_url_c))
    names = [broker.name for broker in brokers]
    if len(set(names)) != len(names):
        # Peaks and run tags are keyed by name: two brokers of one name would mix.
        raise SystemExit(f"the brokers need distinct names, got {', '.join(names)}")
    return tuple(brokers)


def write_json(
    path: Path, env: dict[str, object], settings: Settings, rows: list[Row], peaks: Peaks
) -> None:
    """Every value of the comparison, for the record beside the doc's table."""
    report = {
        "environment": env,
        "settings": {key: value for key, value in asdict(settings).items() if key != "streamq"},
        "rows": [row_summary(row) for row in rows],
        "peak_rss_kib": asdict(peaks),
    }
    path.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
