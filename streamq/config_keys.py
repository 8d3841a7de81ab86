"""The table of `streamq serve`'s configuration keys: for each, its flag, its INI section
and names, its environment variable, its default and its parser.

Owns the names, so that the command line, the config file, the environment, the
`--print-config` listing and docs/configuration.md all speak of one set. The names follow
LavinMQ's (`lavinmq.ini` and its flags) so that a LavinMQ operator's habits carry over;
keys of our own sit in the section they concern. It parses nothing itself (the loader,
`streamq.config`, does) and imports nothing of the broker but the value parsers.

The environment rule: every key's variable is `STREAMQ_` and its name in capitals
(`amqp_port`: `STREAMQ_AMQP_PORT`), plus the aliases listed in `env_aliases`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from streamq import config_values as v

ENV_PREFIX: Final = "STREAMQ_"
# LavinMQ's sections; [http] is its old name for [mgmt].
SECTIONS: Final = ("main", "amqp", "stream", "mgmt", "clustering", "mqtt")
SECTION_ALIASES: Final = {"http": "mgmt"}
# Sections LavinMQ reads that streamq does not (yet): their keys are named in the start-up
# warning, as unsupported keys are; any other section is a mistake and refused.
LAVINMQ_ONLY_SECTIONS: Final = frozenset({"experimental", "oauth", "replication"})


@dataclass(frozen=True, slots=True)
class Key:
    """One setting. `name` is its canonical name (its environment variable's tail and its
    line in `--print-config`); `field` the ServeConfig field it fills (None: used by the
    command line itself, as `log_level`)."""

    name: str
    parse: v.Parser
    default: str  # as an operator would write it; "" is not parsed (an empty path, no hash)
    help: str
    ini: tuple[tuple[str, str], ...] = ()  # (section, key); the first is the documented one
    flags: tuple[str, ...] = ()  # the first long one is shown as the value's source
    field: str | None = ""  # "": the ServeConfig field of the same name
    flag_const: str | None = None  # a flag that takes no value and means this text
    env_aliases: tuple[str, ...] = ()
    metavar: str = "VALUE"
    choices: tuple[str, ...] | None = None

    @property
    def env(self) -> tuple[str, ...]:
        return (ENV_PREFIX + self.name.upper(), *self.env_aliases)

    @property
    def serve_field(self) -> str | None:
        return self.name if self.field == "" else self.field

    @property
    def flag(self) -> str:
        return next((flag for flag in self.flags if flag.startswith("--")), "")


KEYS: Final[tuple[Key, ...]] = (
    # [main]
    Key("data_dir", parse=v.text, default="./data", help="data directory",
         ini=(("main", "data_dir"),), flags=("-D", "--data-dir"), metavar="DIR"),
    Key("log_level", field=None, parse=v.log_level, default="info",
         help="log level: debug, info, warning, error, critical (LavinMQ's trace, notice, "
         "warn and fatal too)",
         ini=(("main", "log_level"),), flags=("-l", "--log-level"), metavar="LEVEL"),
    Key("log_file", field=None, parse=v.text, default="",
         help="append the log to this file instead of stderr",
         ini=(("main", "log_file"),), metavar="FILE"),
    Key("log_format", field=None, parse=v.log_format, default="text",
         help="log line format: text, or json (an object per line: time, level, logger, "
         "message and fields such as connection, vhost, queue)",
         ini=(("main", "log_format"),), flags=("--log-format",), metavar="FORMAT",
         choices=v.LOG_FORMATS),
    Key("log_progress_interval", field=None, parse=v.in_range(0, 86400), default="10",
         help="seconds between progress lines of long work (recovery, definitions "
         "import, full sync); 0: a line per item",
         ini=(("main", "log_progress_interval"),), metavar="S"),
    Key("pidfile", parse=v.text, default="",
         help="write the process id here once the data directory is locked; removed at "
         "a clean shutdown",
         ini=(("main", "pidfile"),), flags=("--pidfile",), metavar="FILE"),
    Key("tls_cert", parse=v.text, default="",
         help="TLS certificate file (PEM; a chain with the certificate first)",
         ini=(("main", "tls_cert"), ("amqp", "tls_cert"), ("mgmt", "tls_cert")),
         flags=("--cert",), metavar="FILE"),
    Key("tls_key", parse=v.text, default="",
         help="TLS private key file (PEM); empty: in the certificate file",
         ini=(("main", "tls_key"), ("amqp", "tls_key"), ("mgmt", "tls_key")),
         flags=("--key",), metavar="FILE"),
    Key("tls_ciphers", parse=v.text, default="",
         help="OpenSSL cipher list for TLS 1.2; empty: OpenSSL's defaults",
         ini=(("main", "tls_ciphers"),), flags=("--ciphers",), metavar="LIST"),
    Key("tls_min_version", parse=v.tls_version, default="1.2",
         help="lowest TLS version accepted", ini=(("main", "tls_min_version"),),
         flags=("--tls-min-version",), metavar="VERSION", choices=v.TLS_VERSIONS),
    Key("tls_verify_peer", parse=v.boolean, default="false",
         help="ask TLS clients for a certificate signed by tls_ca_cert (then SASL "
         "EXTERNAL logs in as its CN)",
         ini=(("main", "tls_verify_peer"),), flags=("--tls-verify-peer",), flag_const="true"),
    Key("tls_ca_cert", parse=v.text, default="",
         help="CA certificates (PEM) that client certificates are verified against",
         ini=(("main", "tls_ca_cert"),), flags=("--cacert",), metavar="FILE"),
    Key("default_user", parse=v.text, default="guest",
         help="the first user of a fresh data directory (administrator, full permissions "
         "on /)",
         ini=(("main", "default_user"),), flags=("--default-user",), metavar="USER"),
    Key("default_password_hash", parse=v.password_hash, default="",
         help="its password as a RabbitMQ sha256 hash (`streamq ctl hash_password`); "
         "empty: the hash of guest",
         ini=(("main", "default_password_hash"), ("main", "default_password")),
         flags=("--default-password-hash", "--default-password"),
         env_aliases=("STREAMQ_DEFAULT_PASSWORD",), metavar="HASH"),
    Key("load_definitions", parse=v.text, default="",
         help="a RabbitMQ/LavinMQ definitions JSON file imported at boot, before the "
         "listeners open",
         ini=(("main", "load_definitions"),), metavar="FILE"),
    Key("memory_high_watermark", field=None, parse=v.memory_limit, default="0.4",
         help="block publishers above this memory: a fraction of RAM or a size",
         ini=(("main", "memory_high_watermark"),), flags=("--memory-high-watermark",),
         metavar="LIMIT"),
    Key("disk_free_limit", field=None, parse=v.size, default="64MiB",
         help="block publishers when the data directory's disk has less free",
         ini=(("main", "free_disk_min"), ("main", "disk_free_limit")),
         flags=("--disk-free-limit",), metavar="SIZE"),
    Key("consumer_timeout_ms", parse=v.in_range(0, 2**53), default="1800000",
         help="close a channel whose delivery stays unacked this long (ms); 0: never",
         ini=(("main", "consumer_timeout"), ("amqp", "consumer_timeout")),
         flags=("--consumer-timeout-ms",), metavar="MS"),
    Key("direct_io", parse=v.boolean, default="true",
         help="write message logs past the page cache where the file system allows it "
         "(streams always go through it)",
         ini=(("main", "direct_io"),), flags=("--no-direct-io",), flag_const="false"),
    # [amqp]
    Key("amqp_bind", field="bind", parse=v.address, default="127.0.0.1",
         help="address of the AMQP listeners", ini=(("amqp", "bind"),),
         flags=("--amqp-bind",), metavar="ADDRESS"),
    Key("amqp_port", parse=v.port, default="5672", help="AMQP port",
         ini=(("amqp", "port"),), flags=("-p", "--amqp-port"), metavar="PORT"),
    Key("amqps_port", parse=v.optional_port, default="-1", help="AMQPS (TLS) port; -1: off",
         ini=(("amqp", "tls_port"),), flags=("--amqps-port",), metavar="PORT"),
    Key("amqp_unix_path", parse=v.text, default="",
         help="AMQP on this unix socket path; empty: none",
         ini=(("amqp", "unix_path"),), flags=("--amqp-unix-path",), metavar="PATH"),
    Key("heartbeat", field="heartbeat_s", parse=v.in_range(0, 65535), default="60",
         help="heartbeat offered in connection.tune (s); 0: none",
         ini=(("amqp", "heartbeat"),), metavar="S"),
    Key("frame_max", parse=v.in_range(4096, 1 << 20), default="131072",
         help="largest frame offered in connection.tune (bytes)",
         ini=(("amqp", "frame_max"),), metavar="BYTES"),
    Key("channel_max", parse=v.in_range(1, 65535), default="2047",
         help="most channels per connection offered in connection.tune",
         ini=(("amqp", "channel_max"),), metavar="N"),
    Key("max_message_size", parse=v.bounded_size(1, 512 << 20), default="134217728",
         help="largest message body accepted (bytes or a size); RabbitMQ's limit is 512MiB",
         ini=(("amqp", "max_message_size"),), metavar="SIZE"),
    Key("tcp_proxy_protocol", parse=v.proxy_protocol, default="0",
         help="PROXY protocol version (1 or 2) that leads each TCP AMQP (and MQTT) "
         "connection; 0: off",
         ini=(("amqp", "tcp_proxy_protocol"), ("amqp", "proxy_protocol")), metavar="0|1|2"),
    Key("unix_proxy_protocol", parse=v.proxy_protocol, default="0",
         help="PROXY protocol version on the unix sockets (AMQP and MQTT); 0: off",
         ini=(("amqp", "unix_proxy_protocol"),), metavar="0|1|2"),
    # [stream] (RabbitMQ's stream plugin: stream.listeners.tcp.1, stream.frame_max, ...)
    Key("stream_port", parse=v.optional_port, default="5552",
         help="RabbitMQ stream protocol port; -1: off", ini=(("stream", "port"),),
         flags=("--stream-port",), metavar="PORT"),
    Key("streams_port", parse=v.optional_port, default="-1",
         help="stream protocol over TLS port (the AMQPS certificate); -1: off",
         ini=(("stream", "tls_port"),), flags=("--streams-port",), metavar="PORT"),
    Key("stream_frame_max", parse=v.in_range(8192, 1 << 26), default="1048576",
         help="largest stream protocol frame offered in Tune (bytes)",
         ini=(("stream", "frame_max"),), metavar="BYTES"),
    Key("stream_heartbeat", field="stream_heartbeat_s", parse=v.in_range(0, 65535),
         default="60", help="heartbeat offered in the stream protocol's Tune (s); 0: none",
         ini=(("stream", "heartbeat"),), metavar="S"),
    Key("stream_advertised_host", parse=v.text, default="",
         help="host that PeerProperties, Open and Metadata tell stream clients (RabbitMQ's "
         "stream.advertised_host); empty: this machine's host name, as RabbitMQ",
         ini=(("stream", "advertised_host"),),
         flags=("--stream-advertised-host",), metavar="HOST"),
    Key("stream_advertised_port", parse=v.in_range(0, 65535), default="0",
         help="port that Open and Metadata tell stream clients (RabbitMQ's "
         "stream.advertised_port); 0: the listener's port the client connected to",
         ini=(("stream", "advertised_port"),), flags=("--stream-advertised-port",),
         metavar="PORT"),
    # [mqtt] (LavinMQ's section and keys; issue 33, docs/mqtt.md)
    Key("mqtt_bind", parse=v.address, default="127.0.0.1",
         help="address of the MQTT listener", ini=(("mqtt", "bind"),),
         flags=("--mqtt-bind",), metavar="ADDRESS"),
    Key("mqtt_port", parse=v.optional_port, default="1883", help="MQTT port; -1: off",
         ini=(("mqtt", "port"),), flags=("--mqtt-port",), metavar="PORT"),
    Key("mqtts_port", parse=v.optional_port, default="-1",
         help="MQTT over TLS port (the AMQPS certificate); -1: off",
         ini=(("mqtt", "tls_port"),), flags=("--mqtts-port",), metavar="PORT"),
    Key("mqtt_unix_path", parse=v.text, default="",
         help="also listen for MQTT on this unix socket (its clients count as local)",
         ini=(("mqtt", "unix_path"),), flags=("--mqtt-unix-path",), metavar="PATH"),
    Key("mqtt_max_inflight_messages", parse=v.in_range(1, 65535), default="65535",
         help="QoS 1 deliveries an MQTT session has unacknowledged at most (its prefetch)",
         ini=(("mqtt", "max_inflight_messages"),), metavar="N"),
    Key("mqtt_default_vhost", parse=v.text, default="/",
         help="vhost of an MQTT login whose user name names none (`vhost:user` does)",
         ini=(("mqtt", "default_vhost"),), metavar="VHOST"),
    Key("mqtt_max_packet_size", parse=v.in_range(64, 268435460), default="1048576",
         help="largest MQTT packet accepted (bytes, fixed header included); larger "
         "closes the connection (5.0: reason 0x95)",
         ini=(("mqtt", "max_packet_size"),), metavar="BYTES"),
    Key("mqtt_topic_alias_maximum", parse=v.in_range(0, 65535), default="16",
         help="Topic Aliases an MQTT 5.0 client may set (CONNACK's Topic Alias Maximum; "
         "RabbitMQ's mqtt.topic_alias_maximum); 0: none",
         ini=(("mqtt", "topic_alias_maximum"),), metavar="N"),
    Key("mqtt_ssl_cert_login", parse=v.boolean, default="false",
         help="an MQTT CONNECT without user name and password over TLS with a verified "
         "client certificate (tls_verify_peer) logs in as the certificate's CN "
         "(RabbitMQ's mqtt.ssl_cert_login)",
         ini=(("mqtt", "ssl_cert_login"),), metavar="BOOL"),
    # [mgmt]
    Key("http_bind", parse=v.address, default="127.0.0.1",
         help="address of the management (HTTP, HTTPS) listeners", ini=(("mgmt", "bind"),),
         flags=("--http-bind",), metavar="ADDRESS"),
    Key("http_port", parse=v.port, default="15672", help="management HTTP port",
         ini=(("mgmt", "port"),), flags=("--http-port",), metavar="PORT"),
    Key("https_port", parse=v.optional_port, default="-1",
         help="management HTTPS port; -1: off", ini=(("mgmt", "tls_port"),),
         flags=("--https-port",), metavar="PORT"),
    Key("websocket_allow_origins", parse=v.origins, default="",
         help="web origins (http://HOST:PORT, comma-separated) whose pages may open AMQP "
         "over WebSocket, others refused with 403 (as RabbitMQ's web_stomp.allow_origins); "
         "empty: any, but only listed or loopback same-origin pages count as local for "
         "guest", ini=(("mgmt", "websocket_allow_origins"),),
         flags=("--websocket-allow-origins",), metavar="ORIGINS"),
    # [clustering] (LavinMQ's names; lease_ttl, the tls_* keys and the hooks' flags are ours)
    Key("clustering", parse=v.boolean, default="false",
         help="run as a node of a cluster: election and membership on etcd, replication "
         "to followers", ini=(("clustering", "enabled"),), flags=("--clustering",),
         flag_const="true"),
    Key("clustering_bind", parse=v.address, default="127.0.0.1",
         help="address of the replication listener", ini=(("clustering", "bind"),),
         flags=("--clustering-bind",), metavar="ADDRESS"),
    Key("clustering_port", parse=v.port, default="5679", help="replication port",
         ini=(("clustering", "port"),), flags=("--clustering-port",), metavar="PORT"),
    Key("clustering_advertised_uri", parse=v.tcp_uri, default="",
         help="where followers reach this node's replication port; empty: "
         "tcp://<clustering bind>:<clustering port>",
         ini=(("clustering", "advertised_uri"),), flags=("--clustering-advertised-uri",),
         metavar="tcp://HOST:PORT"),
    Key("clustering_tls_cert", parse=v.text, default="",
         help="this node's certificate (PEM) on the replication link: with tls_key and "
         "tls_ca, the replication port speaks mutual TLS; all three or none",
         ini=(("clustering", "tls_cert"),), flags=("--clustering-tls-cert",), metavar="FILE"),
    Key("clustering_tls_key", parse=v.text, default="",
         help="the private key (PEM) of clustering_tls_cert",
         ini=(("clustering", "tls_key"),), flags=("--clustering-tls-key",), metavar="FILE"),
    Key("clustering_tls_ca", parse=v.text, default="",
         help="the CA (PEM) that signs every node's replication certificate; each end "
         "verifies the other's against it",
         ini=(("clustering", "tls_ca"),), flags=("--clustering-tls-ca",), metavar="FILE"),
    Key("clustering_etcd_endpoints", parse=v.endpoints, default="localhost:2379",
         help="etcd's client endpoints, comma-separated",
         ini=(("clustering", "etcd_endpoints"),), flags=("--clustering-etcd-endpoints",),
         metavar="HOST:PORT[,...]"),
    Key("clustering_etcd_prefix", parse=v.key_prefix, default="streamq",
         help="the cluster's key prefix in etcd (one cluster per prefix)",
         ini=(("clustering", "etcd_prefix"),), flags=("--clustering-etcd-prefix",),
         metavar="KEY"),
    Key("clustering_lease_ttl", field="clustering_lease_ttl_s", parse=v.in_range(3, 300),
         default="10", help="TTL of the etcd lease the leader holds (s): the failover time "
         "is about this plus a few seconds",
         ini=(("clustering", "lease_ttl"),), flags=("--clustering-lease-ttl",), metavar="S"),
    Key("clustering_on_leader_elected", parse=v.text, default="",
         help="shell command run when this node becomes leader",
         ini=(("clustering", "on_leader_elected"),),
         flags=("--clustering-on-leader-elected",), metavar="COMMAND"),
    Key("clustering_on_leader_lost", parse=v.text, default="",
         help="shell command run when this node stops being leader",
         ini=(("clustering", "on_leader_lost"),), flags=("--clustering-on-leader-lost",),
         metavar="COMMAND"),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Flag:
    """A value given on the command line: its text and the flag that gave it."""

    text: str
    flag: str


BY_NAME: Final = {key.name: key for key in KEYS}
BY_INI: Final = {ini: key for key in KEYS for ini in key.ini}
# `--bind` / STREAMQ_BIND (LavinMQ's -b): the AMQP, HTTP and MQTT listeners' address. A
# key of its own layer names it over the shorthand (`--amqp-bind` beats `--bind`).
BIND_TARGETS: Final = ("amqp_bind", "http_bind", "mqtt_bind")
BIND_ENV: Final = ENV_PREFIX + "BIND"
CONFIG_ENV: Final = ENV_PREFIX + "CONFIG"
# LavinMQ keys whose one behaviour streamq has built in: the value it always has is
# accepted quietly, another one is named in the start-up warning.
BUILT_IN: Final = {
    ("main", "guest_only_loopback"): True,
    ("main", "default_user_only_loopback"): True,
    ("main", "data_dir_lock"): True,
}
