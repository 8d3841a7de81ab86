"""The Node.js clients the tests drive (amqplib; RabbitMQ's stream client for Node):
each lives in a directory of its own with a package.json and a package-lock.json, and
`npm ci` installs the pinned versions into its node_modules the first time."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Final

NPM_TIMEOUT_S: Final = 180
NODE_TIMEOUT_S: Final = 120


def installed(directory: Path, package: str) -> Path:
    """`directory`, with its pinned packages installed (`npm ci` unless `package` is)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    assert node and npm, "Node.js and npm are part of the development machine (docs: env)"
    if not (directory / "node_modules" / package).is_dir():
        subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"],
            cwd=directory,
            check=True,
            timeout=NPM_TIMEOUT_S,
            capture_output=True,
        )
    return directory


def run_script(
    script: Path, *args: str, timeout: float = NODE_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """Runs `node script args...` to its end (at most `timeout` seconds)."""
    return subprocess.run(
        ["node", str(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
