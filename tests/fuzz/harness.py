"""What every fuzz module shares: the seed corpus, the per-input bounds, the bounded
pytest run and the atheris soak.

A fuzz module (tests/fuzz/test_*.py) defines one `fuzz_one(data: bytes) -> None` that
feeds `data` to its parser and raises only when the property is broken: an exception
other than the parser's documented errors, a buffer over its limit, an HTTP 500. The
harness adds the rest:

- `bounded_run(fuzz_one, corpus)` runs in `make test`: every seed of
  tests/fuzz/corpus/<corpus>/ as it is, then `examples` Hypothesis examples (seeds with
  a few bytes mutated, and plain random bytes), derandomized so the run is the same each
  time. Each input has INPUT_SECONDS_MAX of wall time (SIGALRM): a hang fails the test.
- `soak(fuzz_one, corpus)` runs under `make fuzz` (tools/fuzz.sh): atheris, coverage
  guided (libFuzzer), from a copy of the seeds, with libFuzzer's own per-input timeout
  and RSS limit. Its arguments are libFuzzer's (`-runs=1000000`).
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Final

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

CORPUS_ROOT: Final = Path(__file__).parent / "corpus"
# Every wall-clock bound of the fuzzers is multiplied by STREAMQ_FUZZ_WAIT_SCALE (default
# 1): tools/fuzz.sh runs the soak at the lowest CPU priority beside other work, where a
# process can wait seconds for a core (a 3 s wait in the websocket fuzzer failed at load
# average 40); a hang is still caught, it lasts forever.
WAIT_SCALE: Final = float(os.environ.get("STREAMQ_FUZZ_WAIT_SCALE", "1"))
INPUT_SECONDS_MAX: Final = 5.0  # generous: a loaded machine is slow, a hang is forever
SOAK_INPUT_SECONDS_MAX: Final = 10  # libFuzzer's -timeout (whole seconds), scaled
SOAK_RSS_MB_MAX: Final = 3072  # libFuzzer's -rss_limit_mb: unbounded memory fails the soak
MUTATIONS_MAX: Final = 8
RANDOM_BYTES_MAX: Final = 512
# Where the soak writes the inputs that failed (FUZZ_ARTIFACTS overrides).
ARTIFACTS_DEFAULT: Final = Path(tempfile.gettempdir()) / "streamq-fuzz-artifacts"

FuzzOne = Callable[[bytes], None]


def scaled_s(seconds: float) -> float:
    """A fuzzer's wall-clock bound, times WAIT_SCALE."""
    return seconds * WAIT_SCALE


class Hang(Exception):
    """An input took more than INPUT_SECONDS_MAX."""


def seeds(corpus: str) -> list[bytes]:
    """The seed inputs of tests/fuzz/corpus/<corpus>/, in name order."""
    directory = CORPUS_ROOT / corpus
    return [path.read_bytes() for path in sorted(directory.iterdir()) if path.is_file()]


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise Hang in the main thread if the block runs longer than `seconds`."""

    def expire(_signum: int, _frame: FrameType | None) -> None:
        raise Hang(f"input ran longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_one(fuzz_one: FuzzOne, data: bytes) -> None:
    """One input, bounded in time; any exception is a finding (its input is in the
    traceback's locals and in Hypothesis' falsifying example)."""
    with time_limit(scaled_s(INPUT_SECONDS_MAX)):
        fuzz_one(data)


@st.composite
def mutated(draw: st.DrawFn, pool: list[bytes]) -> bytes:
    """A seed with up to MUTATIONS_MAX byte edits: overwrite, insert, delete, truncate."""
    data = bytearray(draw(st.sampled_from(pool)))
    for _ in range(draw(st.integers(0, MUTATIONS_MAX))):
        kind = draw(st.integers(0, 3))
        position = draw(st.integers(0, len(data)))
        if kind == 0 and position < len(data):
            data[position] = draw(st.integers(0, 255))
        elif kind == 1:
            data[position:position] = draw(st.binary(min_size=1, max_size=8))
        elif kind == 2:
            del data[position : position + draw(st.integers(1, 8))]
        else:
            del data[position:]
    return bytes(data)


def inputs(corpus: str) -> st.SearchStrategy[bytes]:
    pool = seeds(corpus)
    return st.one_of(mutated(pool), st.binary(max_size=RANDOM_BYTES_MAX))


def bounded_run(fuzz_one: FuzzOne, corpus: str, examples: int) -> None:
    """The `make test` run: every seed, then `examples` derandomized examples."""
    for data in seeds(corpus):
        run_one(fuzz_one, data)

    @settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(inputs(corpus))
    def examples_run(data: bytes) -> None:
        run_one(fuzz_one, data)

    examples_run()


def soak(fuzz_one: FuzzOne, corpus: str, argv: list[str]) -> None:
    """Run atheris on `fuzz_one` from a copy of the seeds (libFuzzer writes what it
    finds into its first corpus directory; the repository's seeds stay as they are).
    `argv`: libFuzzer's arguments. tests/fuzz/soak.py imports the code under test with
    atheris' coverage instrumentation first."""
    import atheris  # type: ignore[import-untyped]  # noqa: PLC0415  # no stubs; only the soak needs it

    work = Path(tempfile.mkdtemp(prefix=f"streamq-fuzz-{corpus}-"))
    artifacts = Path(os.environ.get("FUZZ_ARTIFACTS", ARTIFACTS_DEFAULT))
    artifacts.mkdir(parents=True, exist_ok=True)
    try:
        shutil.copytree(CORPUS_ROOT / corpus, work / "corpus")
        arguments = [
            "streamq-fuzz",
            str(work / "corpus"),
            f"-timeout={math.ceil(SOAK_INPUT_SECONDS_MAX * WAIT_SCALE)}",
            f"-rss_limit_mb={SOAK_RSS_MB_MAX}",
            f"-artifact_prefix={artifacts}/{corpus}-",
            *argv,
        ]
        atheris.Setup(arguments, fuzz_one)
        atheris.Fuzz()
    finally:
        shutil.rmtree(work, ignore_errors=True)
