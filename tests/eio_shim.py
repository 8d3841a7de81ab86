"""Faults on the I/O of chosen files of a broker process: builds the LD_PRELOAD shim of
tests/eio_shim.c (with the C compiler the C modules need) and gives the environment that
loads it, with switch files that turn each fault on while they exist: failed writes
(EIO, or ENOSPC with `write_errno=errno.ENOSPC`), short writes, failed syncs, failed
reads."""

from __future__ import annotations

import errno
import subprocess
from pathlib import Path

BUILD_TIMEOUT_S = 60
SOURCE = Path(__file__).with_name("eio_shim.c")


class EioShim:
    """The shim built in `directory`, failing calls on paths that contain `match`."""

    def __init__(self, directory: Path, match: str, *, write_errno: int = errno.EIO) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.library = directory / "eio_shim.so"
        subprocess.run(
            ["cc", "-shared", "-fPIC", "-O1", "-o", str(self.library), str(SOURCE), "-ldl"],
            check=True,
            timeout=BUILD_TIMEOUT_S,
        )
        self.match = match
        self.write_errno = write_errno
        self.write_switch = directory / "fail-writes"
        self.short_switch = directory / "short-writes"
        self.sync_switch = directory / "fail-syncs"
        self.read_switch = directory / "fail-reads"

    def environment(self) -> dict[str, str]:
        return {
            "LD_PRELOAD": str(self.library),
            "EIO_SHIM_MATCH": self.match,
            "EIO_SHIM_ERRNO": str(self.write_errno),
            "EIO_SHIM_SWITCH_WRITE": str(self.write_switch),
            "EIO_SHIM_SWITCH_SHORT": str(self.short_switch),
            "EIO_SHIM_SWITCH_SYNC": str(self.sync_switch),
            "EIO_SHIM_SWITCH_READ": str(self.read_switch),
        }

    def fail(
        self, *, writes: bool = False, syncs: bool = False, reads: bool = False, short: bool = False
    ) -> None:
        """From now on: fail the writes, the syncs (fsync, fdatasync), the reads (read,
        pread), write half of each write (`short`); whatever is not named works."""
        switches = (
            (self.write_switch, writes),
            (self.sync_switch, syncs),
            (self.read_switch, reads),
            (self.short_switch, short),
        )
        for switch, on in switches:
            if on:
                switch.touch()
            else:
                switch.unlink(missing_ok=True)
