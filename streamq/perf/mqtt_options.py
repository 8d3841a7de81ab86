"""The flags of `streamq perf mqtt` and the run configurations they become.

Owns the argparse definitions of `streamq perf mqtt throughput` (lavinmqperf's `mqtt
throughput` flags and meanings, src/lavinmqperf/mqtt/throughput.cr, plus `--max-inflight`)
and `streamq perf mqtt connections` (idle connections with keep-alive), the MQTT URI
(`mqtt://user:pass@host:port`, `mqtts://` for TLS, lavinmqperf's default
`mqtt://localhost:1883` with guest), and their checking: `mqtt_throughput_config` turns
parsed flags into an `MqttThroughputConfig` or raises `PerfError`. It starts nothing.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Final
from urllib.parse import unquote, urlsplit

from streamq.perf.errors import PerfError
from streamq.perf.mqtt_wire import PACKET_ID_MAX
from streamq.perf.uri import parse_tls_query

DEFAULT_MQTT_URI: Final = "mqtt://localhost:1883"
DEFAULT_TOPIC: Final = "perf-test"
MQTT_PORT: Final = 1883
MQTTS_PORT: Final = 8883
BODY_BYTES_MAX: Final = 1 << 20  # streamq's default maximum packet size, less headers
KEEP_ALIVE_MAX_S: Final = 0xFFFF


@dataclass(frozen=True, slots=True)
class MqttUri:
    host: str
    port: int
    username: str
    password: str
    tls: bool = False  # mqtts://
    cacertfile: str = ""  # "": the system's CA certificates
    verify: bool = True


@dataclass(frozen=True, slots=True)
class MqttThroughputConfig:
    uri: MqttUri
    publishers: int
    consumers: int
    body_bytes: int
    verify: bool
    qos: int
    topic: str
    max_inflight: int  # QoS 1 publishes unacknowledged per publisher
    publish_rate: int
    consume_rate: int
    duration_s: int
    publish_max: int
    consume_max: int
    random_bodies: bool
    retain: bool
    clean_session: bool
    json: bool
    quiet: bool


def parse_mqtt_uri(text: str) -> MqttUri:
    """Parse `mqtt://user:pass@host:port` (user and password default to guest). Raises
    `PerfError` for another scheme, a missing host or a bad port."""
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise PerfError(f"bad URI {text!r}: {exc}") from None
    if parts.scheme not in ("mqtt", "mqtts"):
        raise PerfError(f"bad URI {text!r}: the scheme must be mqtt:// or mqtts://")
    if not parts.hostname:
        raise PerfError(f"bad URI {text!r}: no host")
    tls = parts.scheme == "mqtts"
    cacertfile, verify = parse_tls_query(text, parts.query, tls, "mqtts")
    return MqttUri(
        host=parts.hostname,
        port=(MQTTS_PORT if tls else MQTT_PORT) if port is None else port,
        username=unquote(parts.username) if parts.username is not None else "guest",
        password=unquote(parts.password) if parts.password is not None else "guest",
        tls=tls,
        cacertfile=cacertfile,
        verify=verify,
    )


def add_mqtt(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `mqtt throughput` and `mqtt connections` under `streamq perf`."""
    mqtt = commands.add_parser("mqtt", help="MQTT 3.1.1: throughput, idle connections")
    tests = mqtt.add_subparsers(dest="mqtt_command", metavar="TEST")
    _add_throughput(tests.add_parser("throughput", help="publish and subscribe at full speed"))
    connections = tests.add_parser("connections", help="open N idle connections")
    connections.add_argument("count", type=int, help="connections to open")
    connections.add_argument(
        "--keepalive", type=int, default=60, help="keep-alive in seconds, pinged (60)"
    )
    connections.add_argument(
        "--hold", type=float, default=0.0, help="seconds to keep them open (0)"
    )
    connections.add_argument("--pid", type=int, help="the broker's pid, to report its VmRSS")
    _add_common(connections)


def _add_common(command: argparse.ArgumentParser) -> None:
    command.add_argument("-u", "--uri", default=DEFAULT_MQTT_URI, help=f"({DEFAULT_MQTT_URI})")
    command.add_argument("-j", "--json", action="store_true", help="JSON summary on stdout")


def _add_throughput(run: argparse.ArgumentParser) -> None:
    _add_common(run)
    flag = run.add_argument
    flag("-x", "--publishers", type=int, default=1, help="publishers (1)")
    flag("-y", "--consumers", type=int, default=1, help="consumers (1)")
    flag("-s", "--size", type=int, default=16, help="body bytes (16)")
    flag("-V", "--verify", action="store_true", help="check every delivered body")
    flag("--qos", type=int, default=0, choices=(0, 1), help="QoS of publishes and subscriptions")
    flag("-t", "--topic", default=DEFAULT_TOPIC, help=f"topic ({DEFAULT_TOPIC})")
    flag(
        "--max-inflight",
        type=int,
        default=1,
        help="QoS 1 publishes awaiting PUBACK per publisher (1: each waits, as lavinmqperf)",
    )
    flag("-r", "--rate", type=int, default=0, help="publish msgs/s per publisher (0: max)")
    flag("-R", "--consumer-rate", type=int, default=0, help="consume msgs/s per consumer")
    flag("-z", "--time", type=int, default=0, help="seconds to run (0: until done or ^C)")
    flag("-q", "--quiet", action="store_true", help="no live line, only the summary")
    flag("-C", "--pmessages", type=int, default=0, help="messages to publish in all (0: no cap)")
    flag("-D", "--cmessages", type=int, default=0, help="messages to consume in all (0: no cap)")
    flag("--random-bodies", action="store_true", help="a random body per message")
    flag("--retain", action="store_true", help="publish with the retain flag")
    flag("--clean-session", action="store_true", help="connect with clean session")


def _check(args: argparse.Namespace) -> None:
    for name in ("publishers", "consumers", "size", "rate", "consumer_rate", "time"):
        if getattr(args, name) < 0:
            raise PerfError(f"--{name.replace('_', '-')} must not be negative")
    for name in ("pmessages", "cmessages"):
        if getattr(args, name) < 0:
            raise PerfError(f"--{name} must not be negative")
    if args.publishers + args.consumers == 0:
        raise PerfError("nothing to run: -x and -y are both 0")
    if args.size > BODY_BYTES_MAX:
        raise PerfError(f"-s: at most {BODY_BYTES_MAX} bytes")
    if not 1 <= args.max_inflight <= PACKET_ID_MAX:
        raise PerfError(f"--max-inflight: from 1 to {PACKET_ID_MAX}")
    if args.verify and args.random_bodies:
        raise PerfError("-V and --random-bodies cannot be combined: nothing to check against")


def mqtt_throughput_config(args: argparse.Namespace) -> MqttThroughputConfig:
    """Check the throughput flags. Raises `PerfError` for a bad URI or combination."""
    _check(args)
    return MqttThroughputConfig(
        uri=parse_mqtt_uri(args.uri),
        publishers=args.publishers,
        consumers=args.consumers,
        body_bytes=args.size,
        verify=args.verify,
        qos=args.qos,
        topic=args.topic,
        max_inflight=args.max_inflight,
        publish_rate=args.rate,
        consume_rate=args.consumer_rate,
        duration_s=args.time,
        publish_max=args.pmessages,
        consume_max=args.cmessages,
        random_bodies=args.random_bodies,
        retain=args.retain,
        clean_session=args.clean_session,
        json=args.json,
        quiet=args.quiet,
    )


def check_connections(count: int, keepalive_s: int, hold_s: float) -> None:
    """Raises `PerfError` for a count below 1, a keep-alive out of range or a negative hold."""
    if count < 1:
        raise PerfError("connections: the count must be at least 1")
    if not 0 <= keepalive_s <= KEEP_ALIVE_MAX_S:
        raise PerfError(f"--keepalive: from 0 to {KEEP_ALIVE_MAX_S}")
    if hold_s < 0:
        raise PerfError("--hold must not be negative")
