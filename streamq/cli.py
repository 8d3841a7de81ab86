"""The `streamq` command line: argument parsing, logging set-up and the subcommands.

Owns the user-facing surface of the process (flags, exit codes, error messages); the work
itself is in `streamq.app`. Bad flags and operating errors end with a one-line message on
stderr and a non-zero exit status, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import cast

from streamq import __version__, ctl, log_output, perf, progress
from streamq.config_ini import ConfigError
from streamq.config_keys import BY_NAME, KEYS, Flag, Key
from streamq.config_values import LOG_LEVELS

logger = logging.getLogger("streamq")


def _validator(key: Key) -> Callable[[str], str]:
    # Flags are checked here, so that a bad one is argparse's usage error (exit 2), but
    # kept as text: streamq.config parses every layer the same way and shows the text.
    def check(text: str) -> str:
        try:
            key.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return text

    return check


def _add_key_flag(serve: argparse.ArgumentParser, key: Key) -> None:
    # SUPPRESS: a flag that is not given leaves no attribute, so that the environment and
    # the config file below it are not masked by argparse defaults.
    default = f" ({key.default})" if key.default else ""
    if key.flag_const is not None:
        serve.add_argument(
            *key.flags,
            dest=key.name,
            action="store_const",
            const=key.flag_const,
            default=argparse.SUPPRESS,
            help=key.help,
        )
        return
    serve.add_argument(
        *key.flags,
        dest=key.name,
        type=_validator(key),
        choices=key.choices,
        default=argparse.SUPPRESS,
        metavar=key.metavar,
        help=key.help + default,
    )


def _add_serve_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = commands.add_parser(
        "serve",
        help="run the broker",
        description="Run the broker. Settings come from these flags, then STREAMQ_<KEY> "
        "environment variables, then the --config file, then the defaults; "
        "docs/configuration.md lists every key.",
    )
    serve.add_argument(
        "-c", "--config", default=argparse.SUPPRESS, metavar="FILE",
        help="an INI config file with LavinMQ's sections and keys (or $STREAMQ_CONFIG)",
    )  # fmt: skip
    serve.add_argument(
        "--print-config",
        action="store_true",
        help="print the effective configuration and where each value came from, and exit",
    )
    serve.add_argument(
        "-b", "--bind", type=_validator(BY_NAME["amqp_bind"]), default=argparse.SUPPRESS,
        metavar="ADDRESS", help="address of all listeners (--amqp-bind and --http-bind)",
    )  # fmt: skip
    for key in KEYS:
        if key.flags:
            _add_key_flag(serve, key)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streamq", description="A streaming-first AMQP 0-9-1 message broker."
    )
    parser.add_argument("--version", action="version", version=f"streamq {__version__}")
    parser.add_argument(
        "--log-level", choices=LOG_LEVELS, default=None, help="stderr log level (info)"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_serve_parser(commands)
    ctl.add_parser(commands)
    perf.add_parser(commands)
    return parser


def configure_logging(level: str, log_file: str = "", log_format: str = "text") -> None:
    """Log to stderr, or append to `log_file`, in `log_format` (streamq/log_output.py);
    raises OSError if the file cannot be opened."""
    log_output.configure(level, log_file, log_format)


def given_flags(args: argparse.Namespace) -> dict[str, Flag]:
    """The serve flags the command line gave, by key name (and "bind", "config")."""
    given = vars(args)
    flags = {
        key.name: Flag(given[key.name], key.flag)
        for key in KEYS
        if key.flags and given.get(key.name) is not None
    }
    for name in ("bind", "config"):
        if name in given:
            flags[name] = Flag(given[name], f"--{name}")
    return flags


def _serve(args: argparse.Namespace) -> int:
    # Imported here: the server pulls in uvloop, aiohttp and the gateways, which `ctl`
    # and `perf` do not need (they start in a fraction of the time without them).
    from streamq import config  # noqa: PLC0415
    from streamq.app import ServeError, serve  # noqa: PLC0415

    try:
        resolved = config.resolve(given_flags(args), os.environ)
    except ConfigError as exc:
        print(f"streamq: {exc}", file=sys.stderr)
        return 1
    if args.print_config:
        sys.stdout.write(config.print_config(resolved))
        return 0
    try:
        configure_logging(
            str(resolved.value("log_level")),
            resolved.text("log_file"),
            str(resolved.value("log_format")),
        )
    except OSError as exc:
        print(f"streamq: cannot open the log file: {exc}", file=sys.stderr)
        return 1
    progress.set_interval_s(float(cast(int, resolved.value("log_progress_interval"))))
    if (warning := config.unsupported_warning(resolved)) is not None:
        logger.warning("%s", warning)
    serve_config = config.serve_config(resolved)
    try:
        if serve_config.clustering:
            from streamq.cluster.controller import serve_clustered  # noqa: PLC0415

            serve_clustered(serve_config)
        else:
            serve(serve_config)
    except ServeError as exc:
        if resolved.value("log_format") == log_output.JSON and not resolved.text("log_file"):
            logger.critical("%s", exc)  # stderr is the JSON log: every line an object
        else:
            print(f"streamq: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    configure_logging(LOG_LEVELS[args.log_level or "info"])
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    if args.command == "ctl":
        return ctl.main(args)
    return perf.main(args)


if __name__ == "__main__":
    sys.exit(main())
