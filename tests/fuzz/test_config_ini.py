"""Fuzz the INI config reader (streamq/config_ini.py) and what reads its values
(streamq/config.py, config_values.py): `streamq serve --config FILE` from any bytes.

An input is a config file's bytes. It is written to a file and resolved as the command
line does (`--config FILE`, an empty environment), then turned into the ServeConfig the
broker would run with and printed as `--print-config` would. The property: ConfigError
is the only exception (a file that is not UTF-8, a malformed line, an unknown section, a
bad value: each names file, line and key), never a traceback from a value's parser.

Run: pytest tests/fuzz/test_config_ini.py (bounded), or
python -m tests.fuzz.soak config_ini -runs=1000000 (atheris soak, tools/fuzz.sh).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from typing import Final

from streamq.config import print_config, resolve, serve_config
from streamq.config_ini import ConfigError
from streamq.config_keys import Flag
from tests.fuzz.broker_host import scratch
from tests.fuzz.harness import bounded_run

CORPUS: Final = "config_ini"
EXAMPLES: Final = 2400
_DIRECTORY: Final = tempfile.mkdtemp(prefix="streamq-fuzz-ini-", dir=scratch())  # in memory
atexit.register(shutil.rmtree, _DIRECTORY, ignore_errors=True)
_PATH: Final = os.path.join(_DIRECTORY, "streamq.ini")


def fuzz_one(data: bytes) -> None:
    with open(_PATH, "wb") as file:
        file.write(data)
    try:
        resolved = resolve({"config": Flag(_PATH, "--config")}, {})
    except ConfigError as exc:
        assert str(exc), "a refusal says why"
        return
    serve_config(resolved)
    print_config(resolved)


def test_config_ini_bounded() -> None:
    bounded_run(fuzz_one, CORPUS, EXAMPLES)
