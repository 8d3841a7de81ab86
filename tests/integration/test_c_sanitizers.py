"""The C modules' tests pass with the modules built under AddressSanitizer and
UndefinedBehaviorSanitizer (STYLE.md section 11): `tools/sanitize.sh` builds them in a
copy of the tree and runs their unit tests there with the runtimes preloaded; any
sanitizer report aborts the run, so it fails this test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_c_modules_tests_pass_under_asan_and_ubsan() -> None:
    result = subprocess.run(
        [str(ROOT / "tools" / "sanitize.sh")],
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin", "HOME": str(Path.home())},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    tail = (result.stdout + result.stderr)[-3000:]
    assert result.returncode == 0, tail
    assert " passed" in result.stdout and "failed" not in result.stdout, tail
