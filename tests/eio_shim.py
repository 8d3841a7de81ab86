"""EIO on the writes and syncs of chosen files of a broker process: builds the LD_PRELOAD
shim of tests/eio_shim.c (with the C compiler the C modules need) and gives the
environment that loads it, with switch files that turn each fault on while they exist."""

from __future__ import annotations

import subprocess
from pathlib import Path

BUILD_TIMEOUT_S = 60
SOURCE = Path(__file__).with_name("eio_shim.c")


class EioShim:
    """The shim built in `directory`, failing calls on paths that contain `match`."""

    def __init__(self, directory: Path, match: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.library = directory / "eio_shim.so"
        subprocess.run(
            ["cc", "-shared", "-fPIC", "-O1", "-o", str(self.library), str(SOURCE), "-ldl"],
            check=True,
            timeout=BUILD_TIMEOUT_S,
        )
        self.match = match
        self.write_switch = directory / "fail-writes"
        self.sync_switch = directory / "fail-syncs"

    def environment(self) -> dict[str, str]:
        return {
            "LD_PRELOAD": str(self.library),
            "EIO_SHIM_MATCH": self.match,
            "EIO_SHIM_SWITCH_WRITE": str(self.write_switch),
            "EIO_SHIM_SWITCH_SYNC": str(self.sync_switch),
        }

    def fail(self, *, writes: bool = False, syncs: bool = False) -> None:
        """Fail the writes, the syncs (fsync, fdatasync) or neither from now on."""
        for switch, on in ((self.write_switch, writes), (self.sync_switch, syncs)):
            if on:
                switch.touch()
            else:
                switch.unlink(missing_ok=True)
