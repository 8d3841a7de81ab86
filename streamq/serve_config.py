"""What `streamq serve` runs with, and the errors that stop it from starting.

Owns `ServeConfig` (filled by the command line, STREAMQ_<KEY> variables and the --config
file in streamq/config.py, or built directly by tests) and `ServeError`. Data only: the
process that runs with it is `streamq.app`, its listeners `streamq.listening`.
"""

from __future__ import annotations

from dataclasses import dataclass

from streamq.broker.queue_arguments import CONSUMER_TIMEOUT_MS_DEFAULT
from streamq.broker.resources import ResourceLimits


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """What `streamq serve` runs with. The command line, STREAMQ_<KEY> environment
    variables and the --config file fill it (streamq/config.py); tests build it directly."""

    data_dir: str = "./data"
    bind: str = "127.0.0.1"  # the AMQP listeners' address ([amqp] bind)
    amqp_port: int = 5672
    http_port: int = 15672
    limits: ResourceLimits | None = None  # None: RabbitMQ's defaults (see resources.py)
    consumer_timeout_ms: int = CONSUMER_TIMEOUT_MS_DEFAULT  # 0: no consumer timeout
    direct_io: bool = True  # segment writes past the page cache where the file system can
    http_bind: str | None = None  # the management listeners' address; None: `bind`
    # Web origins whose pages may open AMQP over WebSocket, canonical and comma-separated
    # (streamq.web_origin); "": any origin, guest only from the broker's own loopback one.
    websocket_allow_origins: str = ""
    # TLS (LavinMQ's names): a listener is off while its port is -1.
    amqps_port: int = -1
    https_port: int = -1
    tls_cert: str = ""  # PEM: the certificate, or a chain with it first
    tls_key: str = ""  # PEM private key; "": in the certificate file
    tls_ciphers: str = ""  # OpenSSL cipher list for TLS 1.2; "": OpenSSL's defaults
    tls_min_version: str = "1.2"  # "1.2" or "1.3"
    tls_verify_peer: bool = False  # ask for a client certificate, verified against ca_cert
    tls_ca_cert: str = ""
    # AMQP over a unix socket ("" : none), and PROXY protocol on the AMQP listeners
    # (0: off; 1 or 2: a PROXY header, v1 or v2, must lead each connection).
    # RabbitMQ's stream protocol (stream_gateway): a listener is off while its port is -1;
    # the TLS one uses the AMQPS certificate. The advertised address is what Metadata and
    # Open tell clients to connect to ("" / 0: the address the client connected to).
    stream_port: int = 5552
    streams_port: int = -1
    stream_frame_max: int = 1_048_576
    stream_heartbeat_s: int = 60
    stream_advertised_host: str = ""
    stream_advertised_port: int = 0
    amqp_unix_path: str = ""
    tcp_proxy_protocol: int = 0
    unix_proxy_protocol: int = 0
    # MQTT (mqtt_gateway; LavinMQ's [mqtt] keys): the listener is off while its port is -1.
    mqtt_bind: str | None = None  # None: `bind`
    mqtt_port: int = 1883
    mqtts_port: int = -1  # MQTT over TLS, with the AMQPS certificate
    mqtt_unix_path: str = ""
    mqtt_max_inflight_messages: int = 65535
    mqtt_default_vhost: str = "/"
    mqtt_max_packet_size: int = 1_048_576
    mqtt_topic_alias_maximum: int = 16
    mqtt_ssl_cert_login: bool = False  # RabbitMQ's mqtt.ssl_cert_login
    # What the AMQP connection tuning offers (connection.tune).
    heartbeat_s: int = 60
    frame_max: int = 131072
    channel_max: int = 2047
    max_message_size: int = 128 * 1024 * 1024
    # A fresh data directory's first user (guest/guest unless set); the hash is
    # RabbitMQ's format (base64 of salt and SHA-256), "" for the hash of "guest".
    default_user: str = "guest"
    default_password_hash: str = ""
    load_definitions: str = ""  # a definitions JSON imported at boot, before listening
    pidfile: str = ""
    # Clustering (streamq.cluster; LavinMQ's [clustering] keys): off unless `clustering`.
    clustering: bool = False
    clustering_bind: str = "127.0.0.1"
    clustering_port: int = 5679
    clustering_advertised_uri: str = ""  # "": tcp://<clustering_bind>:<clustering_port>
    # The replication link's mutual TLS (all three, or none: clear text).
    clustering_tls_cert: str = ""
    clustering_tls_key: str = ""
    clustering_tls_ca: str = ""
    clustering_etcd_endpoints: str = "localhost:2379"
    clustering_etcd_prefix: str = "streamq"
    clustering_lease_ttl_s: int = 10
    clustering_on_leader_elected: str = ""
    clustering_on_leader_lost: str = ""


class ServeError(Exception):
    """An operating error that stops the broker from starting (bad directory, port taken)."""


class DataDirLocked(ServeError):
    """Another process holds the data directory."""
