"""What the process's log looks like on its way out: the text and JSON line formats, and
journald's priority prefixes.

Owns the handler and formatter that `streamq serve` (and `ctl`, `perf`) log through:

* `text` (the default): `TIME LEVEL LOGGER: MESSAGE`, a traceback on the lines after.
* `json`: one object per line, `time` (RFC 3339, UTC, microseconds), `level` (debug, info,
  warning, error, critical, as RabbitMQ's JSON formatter names them), `logger`,
  `message`, then the record's structured fields (streamq/log_fields.py: `connection`,
  `vhost`, `queue`, `user`...), then `exception` (`type`, `message`, `traceback`) when
  the line carries one: logged with `exc_info`, or given as the field `exception`
  (`extra={"exception": exc}`: its traceback in JSON, the text line left as it was).
  A newline in a message is escaped, so a line is an object.
* Under systemd, when stderr is the journal's stream (`JOURNAL_STREAM` names its device
  and inode, as LavinMQ checks it), every line starts with its syslog priority (`<6>`
  for info), which journald reads as the entry's priority; the text format then drops
  the time, which journald records itself, and prefixes each line of a traceback too.
  The JSON format keeps its `time`: a tool reading the objects wants it.

It must not decide what is logged nor where fields come from; it formats records.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import sys
import threading
import traceback
import types
from collections.abc import Mapping
from typing import Final, TextIO

TEXT: Final = "text"
JSON: Final = "json"
FORMATS: Final = (TEXT, JSON)
TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"
JOURNAL_TEXT_FORMAT: Final = "%(levelname)s %(name)s: %(message)s"
JOURNAL_STREAM_ENV: Final = "JOURNAL_STREAM"
# syslog(3)'s priorities of Python's levels: journald has no level between info and
# warning (notice, 5, is LavinMQ's; Python has none).
PRIORITY_DEFAULT: Final = 6
PRIORITIES: Final = {
    logging.DEBUG: 7,
    logging.INFO: 6,
    logging.WARNING: 4,
    logging.ERROR: 3,
    logging.CRITICAL: 2,
}
# Attributes every LogRecord has (and those Formatter.format adds): anything else on a
# record came from `extra=` and is a structured field.
_RECORD_ATTRIBUTES: Final = frozenset(
    (*logging.LogRecord("", 0, "", 0, "", (), None).__dict__, "message", "asctime", "taskName")
)


def priority(levelno: int) -> int:
    """The syslog priority of a Python level: that of the nearest level at or below it."""
    below = [level for level in PRIORITIES if level <= levelno]
    return PRIORITIES[max(below)] if below else PRIORITIES[logging.DEBUG]


def record_fields(record: logging.LogRecord) -> dict[str, object]:
    """The structured fields of `record`: the attributes `extra=` gave it."""
    return {k: v for k, v in record.__dict__.items() if k not in _RECORD_ATTRIBUTES}


def rfc3339_utc(created_s: float) -> str:
    """`2026-12-05T10:04:51.123456Z`."""
    when = datetime.datetime.fromtimestamp(created_s, datetime.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module docstring for its keys)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": rfc3339_utc(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record_fields(record).items():
            shown = exception_fields(value) if isinstance(value, BaseException) else value
            line.setdefault(key, shown)  # a field never hides one of the four above
        if record.exc_info and record.exc_info[1] is not None:  # over an `exception` field
            line["exception"] = exception_fields(record.exc_info[1])
        if record.stack_info:
            line["stack"] = record.stack_info
        return json.dumps(line, ensure_ascii=False, default=str)


def exception_fields(exc: BaseException) -> dict[str, str]:
    return {
        "type": type(exc).__qualname__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc)).rstrip("\n"),
    }


class JournalFormatter(logging.Formatter):
    """Wraps a formatter: each line of its output starts with the record's `<priority>`."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        prefix = f"<{priority(record.levelno)}>"
        return "\n".join(prefix + line for line in self.inner.format(record).split("\n"))


def journal_stream(stream: TextIO, environ: Mapping[str, str]) -> bool:
    """Whether `stream` is the journal's (`JOURNAL_STREAM` is "DEVICE:INODE" of it, as
    systemd sets it for a service whose output goes to the journal). A child that
    inherited the variable but writes elsewhere does not match."""
    value = environ.get(JOURNAL_STREAM_ENV, "")
    device, _, inode = value.partition(":")
    if not device.isdigit() or not inode.isdigit():
        return False
    try:
        info = os.fstat(stream.fileno())
    except (OSError, ValueError):  # ValueError: a stream without a file descriptor
        return False
    return info.st_dev == int(device) and info.st_ino == int(inode)


def formatter(log_format: str, *, journal: bool) -> logging.Formatter:
    """The formatter of `log_format` ("text" or "json"), for the journal or not."""
    if log_format == JSON:
        inner: logging.Formatter = JsonFormatter()
    elif log_format == TEXT:
        inner = logging.Formatter(JOURNAL_TEXT_FORMAT if journal else TEXT_FORMAT)
    else:
        raise ValueError(f"not a log format: {log_format!r} ({', '.join(FORMATS)})")
    return JournalFormatter(inner) if journal else inner


def configure(
    level: str,
    log_file: str = "",
    log_format: str = TEXT,
    environ: Mapping[str, str] | None = None,
) -> None:
    """Log at `level` to stderr, or append to `log_file`, in `log_format`; raises OSError
    if the file cannot be opened. The journal's prefixes apply to stderr only, as
    LavinMQ's: a log file is read by other tools."""
    environ = os.environ if environ is None else environ
    handler: logging.Handler
    if log_file:
        handler = logging.FileHandler(log_file)
        journal = False
    else:
        handler = logging.StreamHandler(sys.stderr)
        journal = journal_stream(sys.stderr, environ)
    handler.setFormatter(formatter(log_format, journal=journal))
    logging.basicConfig(handlers=[handler], level=level.upper())
    if log_format == JSON:
        # What Python would print to stderr itself goes through the log, as objects.
        logging.captureWarnings(True)
        sys.excepthook = _log_uncaught
        threading.excepthook = _log_uncaught_in_thread


def _log_uncaught(
    kind: type[BaseException], exc: BaseException, trace: types.TracebackType | None
) -> None:
    logging.getLogger("streamq").critical("uncaught exception", exc_info=(kind, exc, trace))


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit or args.exc_value is None:
        return
    name = args.thread.name if args.thread is not None else "?"
    logging.getLogger("streamq").critical(
        "uncaught exception in thread %s",
        name,
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
    )
