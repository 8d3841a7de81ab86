"""streamq against RabbitMQ over TLS, each with the same certificate, in one run.

Usage: python benchmarks/tls_compare.py [--dir DIR] [--quick] [--json FILE] [--only KEYS]

Makes a CA and a server certificate for 127.0.0.1 with `openssl` (tests/integration/
certs.py), starts `streamq serve` with --amqps-port and Debian's RabbitMQ with
`listeners.ssl.default` (tests/differential/peers.py), both on free loopback ports with
fresh directories under DIR, runs `benchmarks/compare.py` on the TLS rows and their TCP
twins (publish only 16 B and 1 KiB, 1 pub + 1 cons) with both brokers' amqp:// and
amqps:// URIs, and stops both brokers by their pids. What compare.py prints (the table,
the TLS/TCP shares) is this script's output.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Final

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import compare
from benchmarks.perf_process import StreamqServe, default_streamq
from tests.differential.peers import RabbitMQServer, TlsFiles, free_port
from tests.integration import certs

KEYS: Final = "publish-16,tls-publish-16,publish-1024,tls-publish-1024,ack,tls-ack"


def make_certificates(directory: Path) -> TlsFiles:
    directory.mkdir(parents=True, exist_ok=True)
    ca = certs.make_ca(directory, "bench-ca")
    server = certs.issue(directory, ca, "bench-server", cn="localhost")
    return TlsFiles(server.cert, server.key, ca.cert)


class StreamqServer(StreamqServe):
    """`streamq serve` with AMQPS too, on free loopback ports; stopped by its pid."""

    def __init__(self, directory: Path, files: TlsFiles) -> None:
        self.amqps_port = free_port()
        tls = ("--amqps-port", str(self.amqps_port), "--cert", str(files.cert))
        super().__init__([default_streamq()], directory, *tls, "--key", str(files.key))


def urls(amqp_port: int, amqps_port: int, ca: Path) -> tuple[str, str]:
    return (
        f"amqp://guest:guest@127.0.0.1:{amqp_port}/%2f",
        f"amqps://guest:guest@127.0.0.1:{amqps_port}/%2f?cacertfile={ca}",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, help="where the brokers and certificates live")
    parser.add_argument("--quick", action="store_true", help="compare.py --quick")
    parser.add_argument("--json", help="compare.py --json FILE")
    parser.add_argument("--only", default=KEYS, help=f"compare.py --only ({KEYS})")
    args = parser.parse_args(argv)
    base = args.dir or Path(tempfile.mkdtemp(prefix="tls-compare-"))
    files = make_certificates(base / "pki")
    streamq = StreamqServer(base / "streamq", files)
    try:
        rabbitmq = RabbitMQServer(base / "rabbitmq", files)
        try:
            beam = rabbitmq._beam_pid()  # the VM's pid: compare.py reads its RSS
            a_tcp, a_tls = urls(streamq.amqp_port, streamq.amqps_port, files.ca)
            b_tcp, b_tls = urls(rabbitmq.amqp_port, rabbitmq.amqps_port, files.ca)
            compare_args = [
                a_tcp, b_tcp, "--tls-url-a", a_tls, "--tls-url-b", b_tls,
                "--name-a", "streamq", "--name-b", "RabbitMQ", "--only", args.only,
                "--pid-a", str(streamq.process.pid),
            ]  # fmt: skip
            if beam is not None:
                compare_args += ["--pid-b", str(beam)]
            if args.quick:
                compare_args.append("--quick")
            if args.json:
                compare_args += ["--json", args.json]
            return compare.main(compare_args)
        finally:
            rabbitmq.stop()
    finally:
        streamq.stop()


if __name__ == "__main__":
    sys.exit(main())
