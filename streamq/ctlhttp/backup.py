"""`streamq ctl backup DIR` on a running broker: `POST /api/backup`.

Owns the verb's request and its output. DIR is made absolute here (against ctl's working
directory) and is a path on the broker's host: the broker writes the copy itself, so that
it can hard-link sealed segments and record the changes made while it copies
(`streamq.broker.backup`). The answer comes when the backup is complete, so the request
waits up to BACKUP_WAIT_S (or `--timeout`, if longer). The offline form (`--data-dir`, a
stopped broker) is `streamq.ctl`'s.
"""

from __future__ import annotations

import argparse
import os
from typing import Final

from streamq.ctlhttp.client import ApiClient, CtlError, JsonValue, path
from streamq.ctlhttp.output import Result, Value

BACKUP_WAIT_S: Final = 3600.0
MIB: Final = 1 << 20


def options(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "--copy",
        action="store_true",
        help="copy sealed segments instead of hard-linking them (same file system only)",
    )


def backup(client: ApiClient, args: argparse.Namespace) -> Result:
    directory = os.path.abspath(args.directory)
    waiting = ApiClient(client.endpoint, max(client.timeout_s, BACKUP_WAIT_S))
    answer = waiting.request(
        "POST", path("backup"), {"directory": directory, "links": not args.copy}
    )
    if not isinstance(answer, dict):
        raise CtlError("unexpected answer to POST /api/backup: not an object")
    return Value(answer, summary(answer))


def summary(report: dict[str, JsonValue]) -> str:
    """One line for people: where, how much, and the sync point."""

    def number(key: str) -> int:
        value = report.get(key)
        return value if isinstance(value, int) else 0

    seconds = (number("finished_ms") - number("started_ms")) / 1000
    return (
        f"Backed up {report.get('data_dir')} to {report.get('directory')} in {seconds:.1f} s: "
        f"{number('files_copied')} files copied ({number('bytes_copied') / MIB:.1f} MiB), "
        f"{number('files_linked')} hard-linked ({number('bytes_linked') / MIB:.1f} MiB), "
        f"{number('replayed_bytes')} bytes of changes replayed."
    )
