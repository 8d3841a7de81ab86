"""The flags of `streamq perf` and the run configurations they become.

Owns the argparse definitions of the `throughput`, `sink`, `connections` and `queues`
subcommands (throughput's flags and meanings are lavinmqperf's) and their checking:
`throughput_config` turns parsed flags into a `ThroughputConfig` or raises `PerfError`
with a one-line reason. It starts nothing.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any, Final, cast

from amqp_gateway.codec import FieldTable
from streamq.perf.errors import PerfError
from streamq.perf.mqtt_options import add_mqtt
from streamq.perf.uri import DEFAULT_URI, AmqpUri, parse_uri
from streamq.perf.wire import STAMP_BYTES

DEFAULT_QUEUE: Final = "perf-test"
PREFETCH_MAX: Final = 65535
BODY_BYTES_MAX: Final = 128 << 20


@dataclass(frozen=True, slots=True)
class ThroughputConfig:
    uri: AmqpUri
    publishers: int
    consumers: int
    body_bytes: int
    ack_every: int
    ack_each: bool
    confirm_max: int
    publish_tx: int
    ack_tx: int
    queue: str
    exchange: str
    routing_key: str
    persistent: bool
    expiration_ms: int  # the per-message `expiration` property; 0: none
    prefetch: int
    publish_rate: int
    consume_rate: int
    duration_s: int
    publish_max: int
    consume_max: int
    queue_args: FieldTable
    consumer_args: FieldTable
    latency: bool
    json: bool
    quiet: bool


def add_subcommands(perf: argparse.ArgumentParser) -> None:
    """Add throughput, sink, connections and queues under `streamq perf`."""
    commands = perf.add_subparsers(dest="perf_command", metavar="TEST")
    _add_throughput(commands.add_parser("throughput", help="publish and consume at full speed"))
    sink = commands.add_parser("sink", help="a null AMQP broker: the client's own ceiling")
    sink.add_argument("--bind", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    sink.add_argument("--port", type=int, default=5673, help="port, 0 picks one (5673)")
    sink.add_argument("-s", "--size", type=int, default=16, help="delivered body bytes (16)")
    connections = commands.add_parser("connections", help="open N idle connections")
    connections.add_argument("count", type=int, help="connections to open")
    connections.add_argument(
        "--hold", type=float, default=0.0, help="seconds to keep them open (0)"
    )
    queues = commands.add_parser("queues", help="declare N queues")
    queues.add_argument("count", type=int, help="queues to declare")
    queues.add_argument("--keep", action="store_true", help="do not delete them afterwards")
    queues.add_argument("--prefix", default="perf-queue-", help="queue name prefix")
    queues.add_argument("--queue-args", default="{}", help="queue arguments, a JSON object")
    for command in (connections, queues):
        _add_common(command)
        command.add_argument("--pid", type=int, help="the broker's pid, to report its VmRSS")
    add_mqtt(commands)


def _add_common(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--uri", default=DEFAULT_URI, help=f"broker URI ({DEFAULT_URI.replace('%', '%%')})"
    )
    command.add_argument("-j", "--json", action="store_true", help="JSON summary on stdout")


def _add_throughput(run: argparse.ArgumentParser) -> None:
    _add_common(run)
    flag = run.add_argument
    flag("-x", "--publishers", type=int, default=1, help="publisher processes (1)")
    flag("-y", "--consumers", type=int, default=1, help="consumer processes (1)")
    flag("-s", "--size", type=int, default=16, help="body bytes (16)")
    flag("-a", "--ack", type=int, default=0, help="ack every N messages; 0: no-ack (0)")
    flag(
        "--ack-each",
        action="store_true",
        help="ack each message with its own basic.ack (multiple=false), as pika's "
        "basic_ack(tag) does; the acks of one read go in one write",
    )
    flag("-c", "--confirm", type=int, default=0, help="confirm mode, N unconfirmed max (0: off)")
    flag("-t", "--tx-publish", type=int, default=0, help="publish N messages per transaction")
    flag("-T", "--tx-ack", type=int, default=0, help="ack N messages per transaction")
    flag("-u", "--queue", default=DEFAULT_QUEUE, help=f"queue ({DEFAULT_QUEUE})")
    flag("-e", "--exchange", default="", help='exchange to publish to ("": the default)')
    flag("-k", "--routing-key", default=None, help="routing key (the queue name)")
    flag("-p", "--persistent", action="store_true", help="persistent messages")
    flag(
        "--expiration",
        type=int,
        default=0,
        metavar="MS",
        help="per-message expiration property in ms (0: none)",
    )
    flag("-P", "--prefetch", type=int, default=0, help="consumer prefetch (0: unlimited)")
    flag("-r", "--rate", type=int, default=0, help="publish msgs/s per publisher (0: max)")
    flag("-R", "--consumer-rate", type=int, default=0, help="consume msgs/s per consumer")
    flag("-z", "--time", type=int, default=0, help="seconds to run (0: until done or ^C)")
    flag("-C", "--pmessages", type=int, default=0, help="messages to publish in all (0: no cap)")
    flag("-D", "--cmessages", type=int, default=0, help="messages to consume in all (0: no cap)")
    flag("--queue-args", default="{}", help='queue arguments, JSON: {"x-queue-type":"stream"}')
    flag("--consumer-args", default="{}", help='consumer arguments, JSON: {"x-stream-offset":1}')
    flag("-l", "--measure-latency", action="store_true", help="report latency percentiles")
    flag("-q", "--quiet", action="store_true", help="no live line, only the summary")


def json_table(text: str, flag: str) -> FieldTable:
    """A JSON object as an AMQP field table. Raises `PerfError` for anything else."""
    try:
        value: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PerfError(f"{flag}: not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise PerfError(f"{flag}: must be a JSON object, got {text!r}")
    # json.loads yields str, int, float, bool, None, list and dict: all field values.
    return cast(FieldTable, value)


def _check_counts(args: argparse.Namespace) -> None:
    for name in ("publishers", "consumers", "size", "ack", "confirm", "tx_publish", "tx_ack"):
        if getattr(args, name) < 0:
            raise PerfError(f"--{name.replace('_', '-')} must not be negative")
    for name in (
        "prefetch",
        "rate",
        "consumer_rate",
        "time",
        "pmessages",
        "cmessages",
        "expiration",
    ):
        if getattr(args, name) < 0:
            raise PerfError(f"--{name.replace('_', '-')} must not be negative")
    if args.publishers + args.consumers == 0:
        raise PerfError("nothing to run: -x and -y are both 0")
    if args.size > BODY_BYTES_MAX:
        raise PerfError(f"-s: at most {BODY_BYTES_MAX} bytes")


def _check_modes(args: argparse.Namespace) -> None:
    if args.confirm and args.tx_publish:
        raise PerfError("-c and -t cannot be combined: a channel is in confirm or tx mode")
    if args.ack_each and args.ack:
        raise PerfError("--ack-each and -a cannot be combined: one ack per message or per N")
    if args.prefetch > PREFETCH_MAX:
        raise PerfError(f"-P: at most {PREFETCH_MAX}")
    if args.prefetch and (args.ack or args.tx_ack) > args.prefetch:
        raise PerfError("-a must not exceed -P: the consumer would wait for messages forever")
    if args.measure_latency and args.size < STAMP_BYTES:
        raise PerfError(f"-l needs bodies of at least {STAMP_BYTES} bytes (-s)")
    if not args.queue:
        raise PerfError("-u: the queue needs a name")


def throughput_config(args: argparse.Namespace) -> ThroughputConfig:
    """Check the throughput flags. Raises `PerfError` for a bad URI, JSON or combination."""
    _check_counts(args)
    _check_modes(args)
    return ThroughputConfig(
        uri=parse_uri(args.uri),
        publishers=args.publishers,
        consumers=args.consumers,
        body_bytes=args.size,
        # -T acks in transactions, so it implies acks: every N messages unless -a says.
        # --ack-each acks every read, each message with a frame of its own.
        ack_every=1 if args.ack_each else args.ack or args.tx_ack,
        ack_each=args.ack_each,
        confirm_max=args.confirm,
        publish_tx=args.tx_publish,
        ack_tx=args.tx_ack,
        queue=args.queue,
        exchange=args.exchange,
        routing_key=args.queue if args.routing_key is None else args.routing_key,
        persistent=args.persistent,
        expiration_ms=args.expiration,
        prefetch=args.prefetch,
        publish_rate=args.rate,
        consume_rate=args.consumer_rate,
        duration_s=args.time,
        publish_max=args.pmessages,
        consume_max=args.cmessages,
        queue_args=json_table(args.queue_args, "--queue-args"),
        consumer_args=json_table(args.consumer_args, "--consumer-args"),
        latency=args.measure_latency,
        json=args.json,
        quiet=args.quiet,
    )
