"""`make chaos`: the long soak of the fault suite. Faults drawn at random from every kind
(tests/faults/nemesis.py) for CHAOS_MINUTES (default 30), against a three-node cluster
and etcd on test hosts, with publishers and consumers throughout; then heal, drain and
the checker. Prints the history's size, the faults injected by kind and the violations;
exits 1 if there is any. Usage:
    python -m tests.faults.chaos [--minutes M] [--seed S] [--dir DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from tests.faults.fault_run import fault_run
from tests.faults.nemesis import Step, random_schedule

MINUTES: Final = 30.0
PLANNED_STEPS_MAX: Final = 10_000  # far more than any soak's minutes hold


def steps_until(deadline: float, seed: int) -> Iterator[Step]:
    """Random faults until `deadline` (time.monotonic())."""
    for step in random_schedule(seed, PLANNED_STEPS_MAX):
        if time.monotonic() >= deadline:
            return
        yield step


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=MINUTES)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--dir", type=Path, default=None, help="keep the run here")
    args = parser.parse_args(argv)
    base = args.dir or Path(tempfile.mkdtemp(prefix="streamq-chaos-"))
    base.mkdir(parents=True, exist_ok=True)
    print(f"chaos: {args.minutes} min, seed {args.seed}, in {base}", flush=True)
    deadline = time.monotonic() + args.minutes * 60
    result = fault_run(base, steps_until(deadline, args.seed))
    print(result.report())
    return 0 if result.verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
