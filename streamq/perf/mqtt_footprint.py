"""`streamq perf mqtt connections N`: what idle MQTT connections cost the broker.

Owns the test: open N MQTT 3.1.1 connections (clean sessions, client ids
`perf-idle-<pid>-<n>`, `--keepalive` seconds), CONNECTING_MAX at a time, on one event
loop; keep each alive with a PINGREQ every half keep-alive while holding them
(`--hold`); then DISCONNECT and close them all. With `--pid`, the broker's VmRSS before
and after opening them, and per connection. Prints what `streamq perf connections`
prints (the same table or JSON, `footprint.format_result`).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Final

from streamq.perf.footprint import FILES_SPARE, broker_rss_kib, raise_file_limit
from streamq.perf.mqtt_client import PINGREQ, PerfConnection, open_connection
from streamq.perf.mqtt_options import MqttUri, check_connections
from streamq.perf.mqtt_roles import all_or_first_error, run_loop

CONNECTING_MAX: Final = 64
SETTLE_S: Final = 1.0
"""Wait after the last CONNACK before reading VmRSS: the broker's last sessions settle."""


def run_mqtt_connections(
    uri: MqttUri, count: int, keepalive_s: int, hold_s: float, pid: int | None
) -> dict[str, object]:
    """Open, hold and close the connections. Raises `PerfError` when one cannot be
    opened (those already open are closed)."""
    check_connections(count, keepalive_s, hold_s)
    raise_file_limit(count + FILES_SPARE)
    result: dict[str, object] = {}

    async def work() -> None:
        result.update(await _open_hold_close(uri, count, keepalive_s, hold_s, pid))

    run_loop(work)
    return result


async def _open_hold_close(
    uri: MqttUri, count: int, keepalive_s: int, hold_s: float, pid: int | None
) -> dict[str, object]:
    rss_before = broker_rss_kib(pid)
    gate = asyncio.Semaphore(CONNECTING_MAX)
    prefix = f"perf-idle-{os.getpid()}-"
    connections: list[PerfConnection] = []

    async def one(index: int) -> None:
        async with gate:
            connection = await open_connection(
                uri, f"{prefix}{index}", clean_session=True, keepalive_s=keepalive_s
            )
            connections.append(connection)

    # The first connections are kept alive while the last ones open (10,000 take a
    # while on a busy broker: longer than a keep-alive).
    pinger = asyncio.get_running_loop().create_task(_keep_alive(connections, keepalive_s))
    try:
        started = time.monotonic()
        await all_or_first_error([one(i) for i in range(count)])
        open_s = time.monotonic() - started
        await asyncio.sleep(SETTLE_S)
        rss_after = broker_rss_kib(pid)
        await asyncio.sleep(hold_s)
        for connection in connections:
            connection.check("an idle connection")
    finally:
        pinger.cancel()
        for connection in connections:
            connection.close(graceful=True)
    return footprint_result(count, open_s, rss_before, rss_after)


async def _keep_alive(connections: list[PerfConnection], keepalive_s: int) -> None:
    """PINGREQ on every open connection each half keep-alive (none without one)."""
    while keepalive_s:
        await asyncio.sleep(keepalive_s / 2)
        for connection in connections:
            connection.write(PINGREQ)  # a no-op on a closed one; checked after the hold


def footprint_result(
    count: int, seconds: float, rss_before: int | None, rss_after: int | None
) -> dict[str, object]:
    result: dict[str, object] = {
        "connections": count,
        "seconds": round(seconds, 3),
        "per_second": round(count / max(seconds, 1e-9), 1),
        "rss_before_kib": rss_before,
        "rss_after_kib": rss_after,
    }
    if rss_before is not None and rss_after is not None:
        result["kib_each"] = round((rss_after - rss_before) / count, 2)
    return result
