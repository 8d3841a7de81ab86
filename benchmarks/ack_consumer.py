"""Consume-only benchmark with per-message acks (issue 19, docs/perf.md "Ack runs").

Consumes N messages from a queue with prefetch P over a raw socket and acks every
delivery with its own basic.ack (multiple=false), as pika, kombu and Celery consumers do;
the acks of one read go out in one `sendall`. Prints the consume rate. The socket
client and the delivery scanner are `streamq perf`'s, so the consumer costs well under a
microsecond per message.

Run against a broker whose queue holds the messages, e.g.:
  streamq perf throughput --uri amqp://guest:guest@127.0.0.1:PORT/%2f \\
      -x 1 -y 0 -C 1000000 -s 16 -u ackq
  .venv/bin/python benchmarks/ack_consumer.py --port PORT --queue ackq -n 1000000 -P 1000
"""

from __future__ import annotations

import argparse
import platform
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from amqp_gateway.codec import methods as m
from streamq.perf.client import AmqpClient
from streamq.perf.uri import parse_uri
from streamq.perf.wire import scan_deliveries, scan_frames

_ACK = struct.Struct(">BHIHHQBB")  # a basic.ack frame on channel 1: type .. frame end
READ_TIMEOUT_S = 30.0


def acks(first_tag: int, count: int) -> bytes:
    pack = _ACK.pack
    return b"".join(
        [pack(1, 1, 13, 60, 80, tag, 0, 0xCE) for tag in range(first_tag, first_tag + count)]
    )


def consume(port: int, queue: str, total: int, prefetch: int) -> float:
    """Consume and ack `total` messages; returns the seconds it took."""
    client = AmqpClient.connect(parse_uri(f"amqp://guest:guest@127.0.0.1:{port}/%2f"))
    client.call(m.BasicQos(prefetch_count=prefetch), m.BasicQosOk)
    client.call(m.BasicConsume(queue=queue, consumer_tag="ack-bench"), m.BasicConsumeOk)
    sock = client.sock
    sock.settimeout(READ_TIMEOUT_S)
    started = time.monotonic()
    first = scan_frames(client.leftover_frames(), stamped=False)
    consumed = first.count
    if first.count:
        sock.sendall(acks(first.first_tag, first.count))
    while consumed < total:
        client.buffer.fill(sock)
        scan = scan_deliveries(client.buffer, stamped=False)
        if scan.count:
            sock.sendall(acks(scan.first_tag, scan.count))
            consumed += scan.count
    elapsed = time.monotonic() - started
    client.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--queue", default="ackq")
    parser.add_argument("-n", "--messages", type=int, default=1_000_000)
    parser.add_argument("-P", "--prefetch", type=int, default=1000)
    args = parser.parse_args()
    elapsed = consume(args.port, args.queue, args.messages, args.prefetch)
    print(f"{platform.processor() or platform.machine()}, Python {platform.python_version()}")
    print(f"consumed {args.messages:,} in {elapsed:.2f} s: {args.messages / elapsed:,.0f} msgs/s")


if __name__ == "__main__":
    main()
