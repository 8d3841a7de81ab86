"""`streamq perf connections N` and `streamq perf queues N`: what idle things cost.

Owns two tests of the broker's footprint. `connections` opens N connections (each with
channel 1 open) one after another, reports how long that took, optionally holds them,
and closes them. `queues` declares N queues on one channel and deletes them again unless
`--keep`. Both read the broker's resident memory (VmRSS in /proc/PID/status) before and
after when given `--pid`, and print a short table or, with `-j`, one JSON object.
"""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path
from typing import Final

from amqp_gateway.codec import FieldTable
from amqp_gateway.codec import methods as m
from streamq.perf.client import AmqpClient
from streamq.perf.errors import PerfError
from streamq.perf.uri import AmqpUri

FILES_SPARE: Final = 64
"""Descriptors kept free beyond one per connection (stdio, pipes, the odd library)."""
_KIB: Final = 1024


def broker_rss_kib(pid: int | None) -> int | None:
    """The VmRSS of process `pid` in KiB, or None without a pid. Raises `PerfError` when
    the process or its status cannot be read."""
    if pid is None:
        return None
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError as exc:
        raise PerfError(f"cannot read the memory of pid {pid}: {exc.strerror or exc}") from None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise PerfError(f"pid {pid} has no VmRSS (a kernel thread?)")


def raise_file_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            raise PerfError(f"{needed} file descriptors needed, the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def run_connections(uri: AmqpUri, count: int, hold_s: float, pid: int | None) -> dict[str, object]:
    """Open `count` connections, hold them `hold_s` seconds, close them. Raises
    `PerfError` when one cannot be opened (those already open are closed)."""
    if count < 1:
        raise PerfError("connections: the count must be at least 1")
    raise_file_limit(count + FILES_SPARE)
    rss_before = broker_rss_kib(pid)
    clients: list[AmqpClient] = []
    started = time.monotonic()
    try:
        for _ in range(count):
            clients.append(AmqpClient.connect(uri))
        open_s = time.monotonic() - started
        rss_after = broker_rss_kib(pid)
        time.sleep(hold_s)
    finally:
        for client in clients:
            client.close()
    return _result("connections", count, open_s, rss_before, rss_after)


def run_queues(
    uri: AmqpUri, count: int, prefix: str, arguments: FieldTable, keep: bool, pid: int | None
) -> dict[str, object]:
    """Declare `count` queues named `prefix0`, `prefix1`... and delete them unless
    `keep`. Raises `PerfError` on a refusal from the broker."""
    if count < 1:
        raise PerfError("queues: the count must be at least 1")
    names = [f"{prefix}{index}" for index in range(count)]
    rss_before = broker_rss_kib(pid)
    client = AmqpClient.connect(uri)
    try:
        started = time.monotonic()
        for name in names:
            client.call(m.QueueDeclare(queue=name, arguments=arguments), m.QueueDeclareOk)
        declare_s = time.monotonic() - started
        rss_after = broker_rss_kib(pid)
        result = _result("queues", count, declare_s, rss_before, rss_after)
        if not keep:
            started = time.monotonic()
            for name in names:
                client.call(m.QueueDelete(queue=name), m.QueueDeleteOk)
            result["delete_s"] = round(time.monotonic() - started, 3)
    finally:
        client.close()
    return result


def _result(
    what: str, count: int, seconds: float, rss_before: int | None, rss_after: int | None
) -> dict[str, object]:
    result: dict[str, object] = {
        what: count,
        "seconds": round(seconds, 3),
        "per_second": round(count / max(seconds, 1e-9), 1),
        "rss_before_kib": rss_before,
        "rss_after_kib": rss_after,
    }
    if rss_before is not None and rss_after is not None:
        result["kib_each"] = round((rss_after - rss_before) / count, 2)
    return result


def format_result(result: dict[str, object], as_json: bool) -> str:
    """One JSON object, or a few aligned lines for a person."""
    if as_json:
        return json.dumps(result)
    what = "connections" if "connections" in result else "queues"
    verb = "opened" if what == "connections" else "declared"
    lines = [f"{result[what]} {what} {verb} in {result['seconds']} s ({result['per_second']}/s)"]
    if "delete_s" in result:
        lines.append(f"deleted again in {result['delete_s']} s")
    before, after = result["rss_before_kib"], result["rss_after_kib"]
    if isinstance(before, int) and isinstance(after, int):
        mib = f"{before / _KIB:.1f} MiB -> {after / _KIB:.1f} MiB"
        lines.append(f"broker VmRSS {mib} ({result['kib_each']} KiB each)")
    return "\n".join(lines)
