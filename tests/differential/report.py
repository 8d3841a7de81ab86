"""Run the differential scenarios by hand and print where brokers differ.

    .venv/bin/python -m tests.differential.report [--lavinmq BIN] [--show] [SUBSTRING ...]

Starts a RabbitMQ and a streamq (and a LavinMQ built from source, when `--lavinmq` names
its binary), runs every scenario whose name contains one of the SUBSTRINGs (all without
one) against each, and prints, per scenario, which brokers agree with RabbitMQ; with
`--show`, the observations of those that differ. The allow-list is not applied: this
prints every difference, deliberate or not (docs/compatibility.md is written from it).
"""

from __future__ import annotations

import argparse
import collections
import pprint
import tempfile
from pathlib import Path

from tests.differential import scenarios
from tests.differential.harness import SCENARIOS, run_scenario
from tests.differential.peers import Endpoint, LavinMQServer, RabbitMQServer
from tests.differential.test_scenarios import prefix_of
from tests.differential.wire import Observation
from tests.integration.conftest import RunningBroker


def kind_of_difference(expected: list[Observation], observed: list[Observation]) -> str:
    """How two runs first part: only a reply text, a reply code, or what was sent."""
    for a, b in zip(expected, observed, strict=False):
        if a == b:
            continue
        same_method = len(a) > 4 and len(b) > 4 and a[:4] == b[:4] and isinstance(a[4], dict)
        if same_method and isinstance(b[4], dict):
            if a[4].get("reply_code") != b[4].get("reply_code"):
                return "reply code"
            if a[4].get("reply_text") != b[4].get("reply_text"):
                return "reply text"
            return "fields"
        return "frames"
    return "frames"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lavinmq", type=Path, help="a LavinMQ binary to compare as well")
    parser.add_argument("--show", action="store_true", help="print differing observations")
    parser.add_argument("names", nargs="*")
    args = parser.parse_args()
    scenarios.load()
    chosen = [n for n in sorted(SCENARIOS) if not args.names or any(a in n for a in args.names)]
    base = Path(tempfile.mkdtemp(prefix="streamq-differential-"))
    rabbitmq = RabbitMQServer(base / "rabbitmq")
    streamq = RunningBroker(base / "streamq")
    lavinmq = LavinMQServer(args.lavinmq, base / "lavinmq") if args.lavinmq else None
    others = [Endpoint("streamq", streamq.amqp_port, streamq.http_port)]
    if lavinmq is not None:
        others.append(lavinmq.endpoint)
    differing = {other.name: 0 for other in others}
    kinds = {other.name: collections.Counter[str]() for other in others}
    try:
        for name in chosen:
            expected = run_scenario(SCENARIOS[name], rabbitmq.endpoint, prefix_of(name))
            marks = []
            for other in others:
                observed = run_scenario(SCENARIOS[name], other, prefix_of(name))
                same = observed == expected
                differing[other.name] += not same
                kind = "" if same else f" ({kind_of_difference(expected, observed)})"
                kinds[other.name][kind.strip(" ()") or "same"] += 1
                marks.append(f"{other.name}={'same' if same else 'DIFF'}{kind}")
                if not same and args.show:
                    print(f"--- {name}: rabbitmq")
                    pprint.pprint(expected, width=120)
                    print(f"--- {name}: {other.name}")
                    pprint.pprint(observed, width=120)
            print(f"{name}: {' '.join(marks)}")
    finally:
        streamq.stop()
        rabbitmq.stop()
        if lavinmq is not None:
            lavinmq.stop()
    print(f"{len(chosen)} scenarios; differing from RabbitMQ: {differing}")
    for name, counts in kinds.items():
        print(f"{name}: {dict(counts)}")


if __name__ == "__main__":
    main()
