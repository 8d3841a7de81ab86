"""streamq.config, config_ini and config_keys: the INI reader, the validation of each
layer's values, the precedence flags > environment > file > defaults, and where
`--print-config` says each value came from. Files are written under tmp_path; the
environment is a plain dict, never the process's."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from streamq.app import ServeConfig
from streamq.broker.resources import DISK_FREE_LIMIT_DEFAULT_BYTES
from streamq.broker.users import hash_password
from streamq.cli import build_parser, given_flags
from streamq.config import Resolved, print_config, resolve, serve_config, unsupported_warning
from streamq.config_ini import FILE_BYTES_MAX, ConfigError, Entry, parse_ini, read_ini
from streamq.config_keys import KEYS, Flag

HASH = hash_password("s3cret", salt=b"salt")


def write(tmp_path: Path, text: str, name: str = "streamq.ini") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def from_file(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> Resolved:
    path = write(tmp_path, text)
    return resolve({"config": Flag(path, "--config")}, environ or {})


def serve_flags(*argv: str) -> dict[str, Flag]:
    return given_flags(build_parser().parse_args(["serve", *argv]))


# -- the INI reader ------------------------------------------------------------------------


def test_reader_keeps_sections_keys_values_and_line_numbers() -> None:
    text = (
        "; a comment\n"
        "# another\n"
        "\n"
        "[main]\n"
        "data_dir = /var/lib/x\n"
        "  TLS_Ciphers =  ECDHE+AESGCM:!aNULL;x=y  \n"
        "[ amqp ]\n"
        "port=5673\n"
        "unix_path =\n"
    )
    assert parse_ini("f.ini", text) == [
        Entry("main", "data_dir", "/var/lib/x", 5),
        Entry("main", "tls_ciphers", "ECDHE+AESGCM:!aNULL;x=y", 6),
        Entry("amqp", "port", "5673", 8),
        Entry("amqp", "unix_path", "", 9),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[main]\njust words\n", "f.ini:2: not a section, a `key = value` line or a comment"),
        ("[main\n", "f.ini:1: not a section, a `key = value` line or a comment"),
        ("= 5\n", "f.ini:1: not a section"),
        ("port = 5672\n[amqp]\n", "f.ini:1: port: a key before any [section]"),
        (
            "[amqp]\nport = 1\n\n[mgmt]\nport = 2\n[amqp]\nport = 3\n",
            "f.ini:7: [amqp] port: given twice (first on line 2)",
        ),
    ],
)
def test_malformed_lines_are_refused_with_file_and_line(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_ini("f.ini", text)
    assert str(raised.value).startswith(message)


def test_missing_big_and_binary_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.ini: cannot read the config file: No such file"):
        read_ini(str(tmp_path / "nope.ini"))
    with pytest.raises(ConfigError, match="cannot read the config file: Is a directory"):
        read_ini(str(tmp_path))
    big = tmp_path / "big.ini"
    big.write_bytes(b";" * (FILE_BYTES_MAX + 1))
    with pytest.raises(ConfigError, match=f"larger than {FILE_BYTES_MAX} bytes"):
        read_ini(str(big))
    binary = tmp_path / "bin.ini"
    binary.write_bytes(b"[main]\ndata_dir = \xff\n")
    with pytest.raises(ConfigError, match=r"bin\.ini: not UTF-8 text"):
        read_ini(str(binary))


# -- values and their errors ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("[amqp]\nport = 70000", "[amqp] port: port out of range 0-65535: 70000"),
        ("[amqp]\nport = five", "[amqp] port: not a port number: 'five'"),
        ("[amqp]\ntls_port = -2", "[amqp] tls_port: port out of range 0-65535: -2 (or -1: off)"),
        ("[main]\nlog_level = loud", "[main] log_level: not a log level: 'loud'"),
        ("[main]\nfree_disk_min = lots", "[main] free_disk_min: not a size: 'lots'"),
        ("[main]\ntls_min_version = 1.1", "[main] tls_min_version: not a TLS version: '1.1'"),
        ("[main]\ntls_verify_peer = maybe", "[main] tls_verify_peer: not a boolean: 'maybe'"),
        ("[amqp]\nframe_max = 100", "[amqp] frame_max: out of range 4096-1048576: 100"),
        ("[amqp]\nheartbeat = -1", "[amqp] heartbeat: out of range 0-65535: -1"),
        ("[amqp]\nproxy_protocol = 3", "[amqp] proxy_protocol: not a PROXY protocol version"),
        ("[main]\ndefault_password = guest", "[main] default_password: not a rabbit_password"),
        ("[main]\nconsumer_timeout = 1.5", "[main] consumer_timeout: not a whole number"),
        ("[main]\ndata_dir_lock = sometimes", "[main] data_dir_lock: not a boolean"),
        ("[shovels]\nx = 1", "[shovels] x: unknown section [shovels]"),
        ("[clustering]\nenabled = sure", "[clustering] enabled: not a boolean: 'sure'"),
        ("[clustering]\nport = 99999", "[clustering] port: port out of range 0-65535"),
        ("[clustering]\nadvertised_uri = n1:5679", "[clustering] advertised_uri: not a tcp://"),
        ("[clustering]\nadvertised_uri = tcp://n1", "[clustering] advertised_uri: not HOST:PORT"),
        ("[clustering]\netcd_endpoints = ,", "[clustering] etcd_endpoints: no endpoint"),
        ("[clustering]\netcd_endpoints = e1:x", "[clustering] etcd_endpoints: not a port number"),
        ("[clustering]\netcd_prefix = a b", "[clustering] etcd_prefix: not a key prefix"),
        ("[clustering]\nlease_ttl = 1", "[clustering] lease_ttl: out of range 3-300: 1"),
        (
            "[mgmt]\nwebsocket_allow_origins = http://a.example/app",
            "[mgmt] websocket_allow_origins: not a web origin: 'http://a.example/app'",
        ),
    ],
)
def test_a_bad_file_value_names_file_line_section_and_key(
    tmp_path: Path, line: str, reason: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        from_file(tmp_path, "; streamq\n" + line + "\n")
    assert str(raised.value).startswith(f"{tmp_path / 'streamq.ini'}:3: {reason}")


def test_a_bad_environment_value_names_the_variable() -> None:
    with pytest.raises(ConfigError) as raised:
        resolve({}, {"STREAMQ_AMQP_PORT": "x"})
    assert str(raised.value) == "environment variable STREAMQ_AMQP_PORT: not a port number: 'x'"
    with pytest.raises(ConfigError, match=r"^environment variable STREAMQ_BIND: "):
        resolve({}, {"STREAMQ_BIND": ""})
    with pytest.raises(ConfigError, match=r"^environment variable STREAMQ_LOG_LEVEL: not a log"):
        resolve({}, {"STREAMQ_LOG_LEVEL": "chatty"})


def test_a_missing_config_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the config file"):
        resolve({}, {"STREAMQ_CONFIG": str(tmp_path / "absent.ini")})


def test_every_default_is_serve_configs_own() -> None:
    """The key table's defaults must build exactly ServeConfig's defaults, so that a
    broker started with no configuration behaves as a test-built ServeConfig()."""
    built = serve_config(resolve({}, {}))
    assert built.limits is not None
    assert built.limits.disk_free_limit_bytes == DISK_FREE_LIMIT_DEFAULT_BYTES
    # ServeConfig's http_bind None means "as bind"; the table names the address itself.
    assert built.http_bind == ServeConfig().bind
    assert built.mqtt_bind == ServeConfig().bind  # the same for mqtt_bind
    assert dataclasses.replace(built, limits=None, http_bind=None, mqtt_bind=None) == ServeConfig()


def test_every_serve_config_field_has_a_key() -> None:
    targets = {key.serve_field for key in KEYS} | {"limits"}
    assert {f.name for f in dataclasses.fields(ServeConfig)} <= targets


def test_a_full_file_fills_every_field(tmp_path: Path) -> None:
    resolved = from_file(
        tmp_path,
        f"""
[main]
data_dir = /srv/q
log_level = warn
pidfile = /run/q.pid
tls_cert = c.pem
tls_key = k.pem
tls_ciphers = ECDHE+AESGCM
tls_min_version = 1.3
tls_verify_peer = yes
tls_ca_cert = ca.pem
default_user = admin
default_password_hash = {HASH}
load_definitions = defs.json
memory_high_watermark = 1GiB
free_disk_min = 2GB
consumer_timeout = 60000
direct_io = false
[amqp]
bind = 0.0.0.0
port = 5673
tls_port = 5671
unix_path = /tmp/q.sock
heartbeat = 30
frame_max = 65536
channel_max = 100
max_message_size = 1MiB
tcp_proxy_protocol = 2
unix_proxy_protocol = true
[http]
bind = ::1
port = 15673
tls_port = 15671
[clustering]
enabled = true
bind = 0.0.0.0
port = 5680
advertised_uri = tcp://node1.example:5680
etcd_endpoints = e1:2379, http://e2:2379
etcd_prefix = q1
lease_ttl = 5
on_leader_elected = touch /tmp/elected
on_leader_lost = touch /tmp/lost
[mqtt]
bind = 127.0.0.2
port = 1884
tls_port = 8884
unix_path = /tmp/mqtt.sock
max_inflight_messages = 10
default_vhost = devices
max_packet_size = 65536
topic_alias_maximum = 3
""",
    )
    assert serve_config(resolved) == ServeConfig(
        data_dir="/srv/q",
        bind="0.0.0.0",
        amqp_port=5673,
        http_port=15673,
        limits=serve_config(resolved).limits,
        consumer_timeout_ms=60000,
        direct_io=False,
        http_bind="::1",
        amqps_port=5671,
        https_port=15671,
        tls_cert="c.pem",
        tls_key="k.pem",
        tls_ciphers="ECDHE+AESGCM",
        tls_min_version="1.3",
        tls_verify_peer=True,
        tls_ca_cert="ca.pem",
        amqp_unix_path="/tmp/q.sock",
        tcp_proxy_protocol=2,
        unix_proxy_protocol=1,
        heartbeat_s=30,
        frame_max=65536,
        channel_max=100,
        max_message_size=1 << 20,
        default_user="admin",
        default_password_hash=HASH,
        load_definitions="defs.json",
        pidfile="/run/q.pid",
        clustering=True,
        clustering_bind="0.0.0.0",
        clustering_port=5680,
        clustering_advertised_uri="tcp://node1.example:5680",
        clustering_etcd_endpoints="e1:2379,http://e2:2379",
        clustering_etcd_prefix="q1",
        clustering_lease_ttl_s=5,
        clustering_on_leader_elected="touch /tmp/elected",
        clustering_on_leader_lost="touch /tmp/lost",
        mqtt_bind="127.0.0.2",
        mqtt_port=1884,
        mqtts_port=8884,
        mqtt_unix_path="/tmp/mqtt.sock",
        mqtt_max_inflight_messages=10,
        mqtt_default_vhost="devices",
        mqtt_max_packet_size=65536,
        mqtt_topic_alias_maximum=3,
    )
    limits = serve_config(resolved).limits
    assert limits is not None
    assert (limits.memory_high_watermark_bytes, limits.disk_free_limit_bytes) == (1 << 30, 2e9)
    assert resolved.value("log_level") == "warning"


# -- precedence ----------------------------------------------------------------------------


def test_each_layer_overrides_the_one_below(tmp_path: Path) -> None:
    path = write(tmp_path, "[amqp]\nport = 1001\nheartbeat = 11\nchannel_max = 7\n")
    environ = {"STREAMQ_CONFIG": path, "STREAMQ_AMQP_PORT": "2002", "STREAMQ_HEARTBEAT": "22"}
    resolved = resolve(serve_flags("--amqp-port", "3003"), environ)
    assert resolved.value("amqp_port") == 3003  # flag over environment over file
    assert resolved.value("heartbeat") == 22  # environment over file
    assert resolved.value("channel_max") == 7  # file over default
    assert resolved.value("frame_max") == 131072  # default
    sources = {key.name: resolved.settings[key.name].source for key in KEYS}
    assert sources["amqp_port"] == "flag --amqp-port"
    assert sources["heartbeat"] == "env STREAMQ_HEARTBEAT"
    assert sources["channel_max"] == f"file {path}:4"
    assert sources["frame_max"] == "default"


def test_stream_advertised_host_and_port_from_file_and_flags(tmp_path: Path) -> None:
    """RabbitMQ's stream.advertised_host and stream.advertised_port: [stream] keys and
    flags; empty and 0 by default (the gateway then advertises the host name, and the
    listener's port)."""
    path = write(tmp_path, "[stream]\nadvertised_host = file.example\nadvertised_port = 5600\n")
    built = serve_config(resolve(serve_flags("--config", path), {}))
    assert (built.stream_advertised_host, built.stream_advertised_port) == ("file.example", 5600)
    host, port = ("--stream-advertised-host", "flag.example"), ("--stream-advertised-port", "7")
    flags = serve_flags("--config", path, *host, *port)
    built = serve_config(resolve(flags, {}))
    assert (built.stream_advertised_host, built.stream_advertised_port) == ("flag.example", 7)
    default = serve_config(resolve(serve_flags(), {}))
    assert (default.stream_advertised_host, default.stream_advertised_port) == ("", 0)


def test_websocket_allow_origins_are_made_canonical(tmp_path: Path) -> None:
    """[mgmt] websocket_allow_origins, its flag and variable: origins in any spelling,
    kept as scheme://host:port (what the upgrade compares an Origin header's with)."""
    path = write(tmp_path, "[mgmt]\nwebsocket_allow_origins = HTTP://App.Example, https://[::1]\n")
    built = serve_config(resolve(serve_flags("--config", path), {}))
    assert built.websocket_allow_origins == "http://app.example:80,https://[::1]:443"
    flags = serve_flags("--websocket-allow-origins", "https://b.example:8443/")
    assert serve_config(resolve(flags, {})).websocket_allow_origins == "https://b.example:8443"
    environ = {"STREAMQ_WEBSOCKET_ALLOW_ORIGINS": "http://127.0.0.1:3000"}
    assert serve_config(resolve(serve_flags(), environ)).websocket_allow_origins == (
        "http://127.0.0.1:3000"
    )
    assert serve_config(resolve(serve_flags(), {})).websocket_allow_origins == ""


def test_a_flag_not_given_does_not_mask_the_layers_below(tmp_path: Path) -> None:
    flags = serve_flags("--data-dir", "d")
    assert set(flags) == {"data_dir"}
    resolved = resolve(flags, {"STREAMQ_HTTP_PORT": "1234", "STREAMQ_DIRECT_IO": "false"})
    assert resolved.value("http_port") == 1234
    assert resolved.value("direct_io") is False
    assert resolve(serve_flags("--no-direct-io"), {}).settings["direct_io"].source == (
        "flag --no-direct-io"
    )


def test_bind_sets_both_listeners_and_a_specific_key_beats_it(tmp_path: Path) -> None:
    resolved = resolve(serve_flags("-b", "0.0.0.0", "--http-bind", "::1"), {})
    assert (resolved.value("amqp_bind"), resolved.value("http_bind")) == ("0.0.0.0", "::1")
    assert resolved.settings["amqp_bind"].source == "flag --bind"
    env = resolve({}, {"STREAMQ_BIND": "10.0.0.1", "STREAMQ_AMQP_BIND": "10.0.0.2"})
    assert (env.value("amqp_bind"), env.value("http_bind")) == ("10.0.0.2", "10.0.0.1")
    # a file's [amqp] bind is beaten by the environment's shorthand, a layer up
    path = write(tmp_path, "[amqp]\nbind = 1.1.1.1\n")
    above = resolve({}, {"STREAMQ_CONFIG": path, "STREAMQ_BIND": "2.2.2.2"})
    assert above.value("amqp_bind") == "2.2.2.2"


def test_lavinmq_aliases(tmp_path: Path) -> None:
    resolved = from_file(
        tmp_path,
        f"[main]\ndefault_password = {HASH}\n[amqp]\ntls_cert = a.pem\nproxy_protocol = true\n"
        "[http]\nport = 1\n",
    )
    assert resolved.value("default_password_hash") == HASH
    assert resolved.value("tls_cert") == "a.pem"
    assert resolved.value("tcp_proxy_protocol") == 1
    assert resolved.value("http_port") == 1
    env = resolve({}, {"STREAMQ_DEFAULT_PASSWORD": HASH})
    assert env.settings["default_password_hash"].source == "env STREAMQ_DEFAULT_PASSWORD"
    both = resolve({}, {"STREAMQ_DEFAULT_PASSWORD": "x", "STREAMQ_DEFAULT_PASSWORD_HASH": HASH})
    assert both.value("default_password_hash") == HASH  # the canonical name wins


def test_flag_values_are_checked_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        serve_flags("--tls-min-version", "1.1")
    assert exited.value.code == 2
    assert "argument --tls-min-version: not a TLS version: '1.1'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        serve_flags("--default-password-hash", "plain")
    assert "not a rabbit_password_hashing_sha256 hash" in capsys.readouterr().err


# -- unsupported keys, print-config --------------------------------------------------------


def test_unsupported_lavinmq_keys_make_one_warning(tmp_path: Path) -> None:
    resolved = from_file(
        tmp_path,
        "[main]\nsocket_buffer_size = 16384\nguest_only_loopback = true\n"
        "default_user_only_loopback = false\n[amqp]\ntcp_nodelay = true\n"
        "[mqtt]\npermission_check_enabled = true\n[experimental]\nyield_each_received_bytes = 1\n",
    )
    warning = unsupported_warning(resolved)
    assert warning is not None
    assert warning.endswith(
        "ignoring 5 setting(s) streamq does not support: [main] socket_buffer_size (line 2); "
        "[main] default_user_only_loopback = false (line 4; streamq always behaves as true); "
        "[amqp] tcp_nodelay (line 6); [mqtt] permission_check_enabled (line 8); "
        "[experimental] yield_each_received_bytes (line 10)"
    )
    assert unsupported_warning(from_file(tmp_path, "[main]\nguest_only_loopback = yes\n")) is None


def test_the_lavinmq_sample_config_reads_without_error(tmp_path: Path) -> None:
    # LavinMQ's extras/config.ini, as shipped (its comments and all).
    resolved = from_file(
        tmp_path,
        "[main]\ndata_dir = /var/lib/lavinmq\nguest_only_loopback = true\nlog_level = info\n"
        ";log_file = /var/log/lavinmq.log\n;tls_cert = /etc/lavinmq/cert.pem\n\n"
        "[mgmt]\nbind = 0.0.0.0\nport = 15672\ntls_port = 15671\n"
        "unix_path = /tmp/lavinmq-http.sock\n\n"
        "[amqp]\nbind = 0.0.0.0\nport = 5672\ntcp_proxy_protocol = false\ntls_port = 5671\n"
        "unix_path = /tmp/lavinmq.sock\nunix_proxy_protocol = true\n",
    )
    # Its TLS ports without a certificate are off, as LavinMQ leaves them.
    assert (resolved.value("amqps_port"), resolved.value("https_port")) == (-1, -1)
    assert resolved.value("unix_proxy_protocol") == 1
    assert resolved.unsupported == [
        "[mgmt] unix_path (line 12)",
        "[amqp] tls_port = 5671 (line 18; no tls_cert: the listener is off, as in LavinMQ)",
        "[mgmt] tls_port = 15671 (line 11; no tls_cert: the listener is off, as in LavinMQ)",
    ]


def test_tls_ports_are_kept_with_a_cert_or_when_asked_for_above_the_file(
    tmp_path: Path,
) -> None:
    with_cert = from_file(tmp_path, "[main]\ntls_cert = c.pem\n[amqp]\ntls_port = 5671\n")
    assert with_cert.value("amqps_port") == 5671
    assert with_cert.unsupported == []
    path = write(tmp_path, "[amqp]\ntls_port = 5671\n")
    asked = resolve(serve_flags("--config", path, "--https-port", "15671"), {})
    assert (asked.value("amqps_port"), asked.value("https_port")) == (-1, 15671)


def test_print_config_shows_every_key_and_its_source(tmp_path: Path) -> None:
    path = write(tmp_path, "[main]\nlog_level = debug\n")
    resolved = resolve(
        serve_flags("--config", path, "--cert", "c.pem"), {"STREAMQ_AMQP_PORT": "5999"}
    )
    lines = print_config(resolved).splitlines()
    assert len(lines) == len(KEYS) + 1
    assert lines[0].split() == ["config", "=", path, "(flag", "--config)"]
    by_name = {line.split()[0]: line.split() for line in lines}
    assert by_name["log_level"] == ["log_level", "=", "debug", "(file", f"{path}:2)"]
    assert by_name["tls_cert"] == ["tls_cert", "=", "c.pem", "(flag", "--cert)"]
    assert by_name["amqp_port"] == ["amqp_port", "=", "5999", "(env", "STREAMQ_AMQP_PORT)"]
    assert by_name["http_port"] == ["http_port", "=", "15672", "(default)"]
    assert by_name["tls_key"] == ["tls_key", "=", "(default)"]


def test_docs_name_every_key_flag_and_variable() -> None:
    docs = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    for key in KEYS:
        for name in (*key.flags, *key.env, *(ini for _, ini in key.ini)):
            assert f"`{name}`" in docs, (key.name, name)


def test_clustering_keys_come_from_flags_environment_and_file(tmp_path: Path) -> None:
    """[clustering] follows the same precedence as every section: a flag beats the
    environment, which beats the file; `--clustering` takes no value."""
    path = write(
        tmp_path,
        "[clustering]\nenabled = false\nport = 5700\netcd_prefix = file\nlease_ttl = 20\n",
    )
    flags = serve_flags(
        "--config", path, "--clustering", "--clustering-etcd-endpoints", "127.0.0.1:2400"
    )
    resolved = resolve(
        flags, {"STREAMQ_CLUSTERING_ETCD_PREFIX": "env", "STREAMQ_CLUSTERING_PORT": "5701"}
    )
    built = serve_config(resolved)
    assert built.clustering is True
    assert built.clustering_port == 5701
    assert built.clustering_etcd_prefix == "env"
    assert built.clustering_etcd_endpoints == "127.0.0.1:2400"
    assert built.clustering_lease_ttl_s == 20
    assert resolved.settings["clustering"].source == "flag --clustering"
    assert resolved.settings["clustering_lease_ttl"].source == f"file {path}:5"
    listing = print_config(resolved)
    assert "clustering_etcd_prefix" in listing and "(env STREAMQ_CLUSTERING_ETCD_PREFIX)" in listing


def test_clustering_flags_are_checked_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        serve_flags("--clustering-advertised-uri", "http://x:1")
    assert "not a tcp:// URI" in capsys.readouterr().err
    assert serve_flags("--clustering-lease-ttl", "4")["clustering_lease_ttl"].text == "4"


def test_clustering_tls_keys_come_from_flags_environment_and_file(tmp_path: Path) -> None:
    """The replication link's TLS files: [clustering] tls_cert / tls_key / tls_ca, their
    flags and STREAMQ_CLUSTERING_TLS_* variables, with the usual precedence; the main
    section's tls_cert (the client listeners') is a different key."""
    path = write(
        tmp_path,
        "[main]\ntls_cert = amqps.pem\n"
        "[clustering]\ntls_cert = file-cert.pem\ntls_key = file-key.pem\ntls_ca = file-ca.pem\n",
    )
    flags = serve_flags("--config", path, "--clustering-tls-cert", "flag-cert.pem")
    resolved = resolve(flags, {"STREAMQ_CLUSTERING_TLS_KEY": "env-key.pem"})
    built = serve_config(resolved)
    assert (built.clustering_tls_cert, built.clustering_tls_key, built.clustering_tls_ca) == (
        "flag-cert.pem",
        "env-key.pem",
        "file-ca.pem",
    )
    assert built.tls_cert == "amqps.pem"
    assert resolved.settings["clustering_tls_cert"].source == "flag --clustering-tls-cert"
    assert resolved.settings["clustering_tls_key"].source == "env STREAMQ_CLUSTERING_TLS_KEY"
    assert resolved.settings["clustering_tls_ca"].source == f"file {path}:6"
    defaults = serve_config(resolve({}, {}))
    assert (defaults.clustering_tls_cert, defaults.clustering_tls_key) == ("", "")
    assert defaults.clustering_tls_ca == ""


def test_a_config_file_of_the_limit_is_read(tmp_path: Path) -> None:
    """The reader takes it in pieces (streamq/config_ini.py `_read_bounded`): a file of
    exactly FILE_BYTES_MAX bytes is whole, and its last line is there."""
    path = tmp_path / "full.ini"
    last = b"\n[mgmt]\nport = 15673\n"
    path.write_bytes(b";" * (FILE_BYTES_MAX - len(last)) + last)
    assert read_ini(str(path))[-1].value == "15673"
