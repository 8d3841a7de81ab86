"""`streamq perf`: a load generator that speaks AMQP 0-9-1 itself (issue 4).

Owns the command's two entry points, called from `streamq.cli`: `add_parser` registers
`streamq perf throughput | sink | connections | queues | mqtt`, and `main` runs one and turns
every operating error into a one-line message on stderr and exit status 1 (never a
traceback). The tests themselves live in the sibling modules: `throughput` (with
`publisher`, `consumer`, `shared`, `worker`, `report`, `latency`), `sink`, `footprint`;
`client` and `wire` are the AMQP client and its hot path over the project's codec;
`mqtt_throughput` (with `mqtt_roles`, `mqtt_client`, `mqtt_wire`, `mqtt_options`) and
`mqtt_footprint` are `streamq perf mqtt throughput | connections`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from streamq.perf.errors import PerfError
from streamq.perf.options import add_subcommands, json_table, throughput_config
from streamq.perf.uri import parse_uri

_USAGE_ERROR = 2


def add_parser(commands: Any) -> None:
    """Register `streamq perf` and its subcommands on the top-level parser."""
    perf = commands.add_parser("perf", help="load generator: throughput, sink, footprint")
    add_subcommands(perf)


def main(args: argparse.Namespace) -> int:
    """Run the chosen test; 0 on success, 1 on an operating error, 2 without a test."""
    if args.perf_command is None:
        print(
            "streamq perf: choose a test: throughput, sink, connections, queues, mqtt",
            file=sys.stderr,
        )
        return _USAGE_ERROR
    if args.perf_command == "mqtt" and args.mqtt_command is None:
        print("streamq perf mqtt: choose a test: throughput, connections", file=sys.stderr)
        return _USAGE_ERROR
    try:
        return _run(args)
    except PerfError as exc:
        print(f"streamq perf: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("streamq perf: interrupted", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    # Imported here: building the command line (every `streamq` start, the broker's too)
    # needs only the options; the tests pull in multiprocessing and their clients.
    from streamq.perf.footprint import format_result, run_connections, run_queues  # noqa: PLC0415
    from streamq.perf.sink import run_sink  # noqa: PLC0415
    from streamq.perf.throughput import run_throughput  # noqa: PLC0415

    command = args.perf_command
    if command == "mqtt":
        return _run_mqtt(args)
    if command == "throughput":
        return run_throughput(throughput_config(args))
    if command == "sink":
        return run_sink(args.bind, args.port, args.size)
    uri = parse_uri(args.uri)
    if command == "connections":
        result = run_connections(uri, args.count, args.hold, args.pid)
    else:
        arguments = json_table(args.queue_args, "--queue-args")
        result = run_queues(uri, args.count, args.prefix, arguments, args.keep, args.pid)
    print(format_result(result, args.json))
    return 0


def _run_mqtt(args: argparse.Namespace) -> int:
    from streamq.perf.footprint import format_result  # noqa: PLC0415  # as in _run
    from streamq.perf.mqtt_footprint import run_mqtt_connections  # noqa: PLC0415
    from streamq.perf.mqtt_options import mqtt_throughput_config, parse_mqtt_uri  # noqa: PLC0415
    from streamq.perf.mqtt_throughput import run_mqtt_throughput  # noqa: PLC0415

    if args.mqtt_command == "throughput":
        return run_mqtt_throughput(mqtt_throughput_config(args))
    uri = parse_mqtt_uri(args.uri)
    result = run_mqtt_connections(uri, args.count, args.keepalive, args.hold, args.pid)
    print(format_result(result, args.json))
    return 0
