"""The `streamq` command line: argument parsing, logging set-up and the subcommands.

Owns the user-facing surface of the process (flags, exit codes, error messages); the work
itself is in `streamq.app`. Bad flags and operating errors end with a one-line message on
stderr and a non-zero exit status, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from streamq import __version__, ctl, perf
from streamq.argtypes import non_negative_int
from streamq.broker.queue_arguments import CONSUMER_TIMEOUT_MS_DEFAULT
from streamq.broker.resources import ResourceLimits, parse_memory_limit, parse_size

LOG_LEVELS = ("debug", "info", "warning", "error")


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port out of range 0-65535: {port}")
    return port


_milliseconds = non_negative_int("a number of milliseconds")


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _memory_limit(text: str) -> int:
    try:
        return parse_memory_limit(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streamq", description="A streaming-first AMQP 0-9-1 message broker."
    )
    parser.add_argument("--version", action="version", version=f"streamq {__version__}")
    parser.add_argument(
        "--log-level", choices=LOG_LEVELS, default="info", help="stderr log level (info)"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    run = commands.add_parser("serve", help="run the broker")
    run.add_argument("--data-dir", default="./data", help="data directory (./data)")
    run.add_argument("--bind", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    run.add_argument("--amqp-port", type=_port, default=5672, help="AMQP port (5672)")
    run.add_argument("--http-port", type=_port, default=15672, help="HTTP port (15672)")
    run.add_argument(
        "--memory-high-watermark",
        type=_memory_limit,
        default=None,
        metavar="LIMIT",
        help="block publishers above this memory: a fraction of RAM or a size (0.4)",
    )
    run.add_argument(
        "--disk-free-limit",
        type=_size,
        default=None,
        metavar="SIZE",
        help="block publishers when the data dir's disk has less free (64MiB)",
    )
    run.add_argument(
        "--consumer-timeout-ms",
        type=_milliseconds,
        default=CONSUMER_TIMEOUT_MS_DEFAULT,
        metavar="MS",
        help="close a channel whose delivery stays unacked this long; 0: never (1800000)",
    )
    run.add_argument(
        "--no-direct-io",
        dest="direct_io",
        action="store_false",
        help="write segments through the page cache (default: direct I/O where the file "
        "system allows it)",
    )
    ctl.add_parser(commands)
    perf.add_parser(commands)
    return parser


def configure_logging(level: str) -> None:
    logging.basicConfig(
        stream=sys.stderr,
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def _limits(memory_bytes: int | None, disk_bytes: int | None) -> ResourceLimits:
    limits = ResourceLimits.defaults()
    if memory_bytes is not None:
        limits.memory_high_watermark_bytes = memory_bytes
    if disk_bytes is not None:
        limits.disk_free_limit_bytes = disk_bytes
    return limits


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    if args.command == "ctl":
        return ctl.main(args)
    if args.command == "perf":
        return perf.main(args)
    # Imported here: the server pulls in uvloop, aiohttp and the gateways, which `ctl`
    # and `perf` do not need (they start in a fraction of the time without them).
    from streamq.app import ServeConfig, ServeError, serve  # noqa: PLC0415

    config = ServeConfig(
        data_dir=args.data_dir,
        bind=args.bind,
        amqp_port=args.amqp_port,
        http_port=args.http_port,
        limits=_limits(args.memory_high_watermark, args.disk_free_limit),
        consumer_timeout_ms=args.consumer_timeout_ms,
        direct_io=args.direct_io,
    )
    try:
        serve(config)
    except ServeError as exc:
        print(f"streamq: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
