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
import pprint
import tempfile
from pathlib import Path

from tests.differential import scenarios
from tests.differential.harness import SCENARIOS, run_scenario
from tests.differential.peers import Endpoint, LavinMQServer, RabbitMQServer
from tests.differential.test_scenarios import prefix_of
from tests.integration.conftest import RunningBroker


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
    try:
        for name in chosen:
            expected = run_scenario(SCENARIOS[name], rabbitmq.endpoint, prefix_of(name))
            marks = []
            for other in others:
                observed = run_scenario(SCENARIOS[name], other, prefix_of(name))
                same = observed == expected
                differing[other.name] += not same
                marks.append(f"{other.name}={'same' if same else 'DIFF'}")
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


if __name__ == "__main__":
    main()
