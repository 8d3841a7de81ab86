"""The `make fuzz` soak of one fuzz module: `python -m tests.fuzz.soak NAME [libFuzzer
arguments]`, NAME a module of tests/fuzz without its `test_` (amqp_frames, ...).

The project's packages are imported under atheris' coverage instrumentation (only they:
instrumenting the standard library too makes each input several times slower), then the
module's `fuzz_one` runs under libFuzzer from a copy of its seed corpus (harness.soak).
tools/fuzz.sh runs every module this way with the C modules built under ASan and UBSan.
"""

from __future__ import annotations

import importlib
import sys

import atheris  # type: ignore[import-untyped]  # atheris ships no type stubs

from tests.fuzz.harness import soak

PACKAGES = ["amqp_gateway", "stream_gateway", "http_gateway", "mqtt_gateway", "streamq"]


def main() -> None:
    name, argv = sys.argv[1], sys.argv[2:]
    with atheris.instrument_imports(include=PACKAGES):
        for package in PACKAGES:
            importlib.import_module(package)
        module = importlib.import_module(f"tests.fuzz.test_{name}")
    soak(module.fuzz_one, module.CORPUS, argv)


if __name__ == "__main__":
    main()
