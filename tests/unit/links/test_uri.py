"""RabbitMQ's AMQP URI spec as `streamq.links.amqp.uri` reads it: the spec's examples,
the Erlang client's defaults, TLS query parameters, and URIs refused with a reason."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from streamq.broker.link_definitions import redact_uri as redact
from streamq.links.amqp.uri import UriInvalid, parse_uri


@pytest.mark.parametrize(
    ("text", "host", "port", "vhost", "username", "password"),
    [
        # The examples of https://www.rabbitmq.com/docs/uri-spec
        ("amqp://user:pass@host:10000/vhost", "host", 10000, "vhost", "user", "pass"),
        (
            "amqp://user%61:%61pass@ho%61st:10000/v%2fhost",
            *("hoast", 10000, "v/host", "usera", "apass"),
        ),
        ("amqp://", "", 5672, "/", "guest", "guest"),
        ("amqp://:@/", "", 5672, "/", "", ""),
        ("amqp://user@", "", 5672, "/", "user", "guest"),
        ("amqp://user:pass@", "", 5672, "/", "user", "pass"),
        ("amqp://host", "host", 5672, "/", "guest", "guest"),
        ("amqp://:10000", None, None, None, None, None),  # a port needs a host
        ("amqp:///vhost", "", 5672, "vhost", "guest", "guest"),
        ("amqp://host/", "host", 5672, "/", "guest", "guest"),
        ("amqp://host/%2f", "host", 5672, "/", "guest", "guest"),
        ("amqp://[::1]", "::1", 5672, "/", "guest", "guest"),
        ("amqps://host", "host", 5671, "/", "guest", "guest"),
        ("amqps://host:5000/prod", "host", 5000, "prod", "guest", "guest"),
    ],
)
def test_rabbitmq_examples(
    text: str,
    host: str | None,
    port: int | None,
    vhost: str | None,
    username: str | None,
    password: str | None,
) -> None:
    if host is None:
        with pytest.raises(UriInvalid):
            parse_uri(text)
        return
    uri = parse_uri(text)
    assert (uri.host, uri.port, uri.vhost, uri.username, uri.password) == (
        host,
        port,
        vhost,
        username,
        password,
    )
    assert uri.local == (host == "")
    assert (uri.tls is not None) == text.startswith("amqps")


def test_defaults_and_query_parameters() -> None:
    uri = parse_uri("amqp://h")
    assert (uri.heartbeat_s, uri.connection_timeout_s, uri.channel_max, uri.frame_max) == (
        10,
        60.0,
        0,
        0,
    )
    uri = parse_uri("amqp://h?heartbeat=5&connection_timeout=2500&channel_max=7&frame_max=8192")
    assert (uri.heartbeat_s, uri.connection_timeout_s, uri.channel_max, uri.frame_max) == (
        5,
        2.5,
        7,
        8192,
    )
    assert parse_uri("amqp://h?heartbeat=0").heartbeat_s == 0
    assert parse_uri("amqp://h?auth_mechanism=external").auth_mechanism == "EXTERNAL"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("http://host", "scheme must be amqp"),
        ("amqp://host:99999", "Port out of range"),
        ("amqp://host:port", "Port could not be cast"),
        ("amqp://host?unknown=1", "unsupported query parameter 'unknown'"),
        ("amqp://host?heartbeat=-1", "heartbeat must be an integer"),
        ("amqp://host?heartbeat=x", "heartbeat must be an integer"),
        ("amqp://host?connection_timeout=0", "connection_timeout must be above 0"),
        ("amqp://host?cacertfile=/ca.pem", "cacertfile needs amqps://"),
        ("amqps://host?verify=maybe", "verify must be verify_peer or verify_none"),
        ("amqps://host?cacertfile=/nonexistent/ca.pem", "cannot read cacertfile"),
        ("amqps://host?keyfile=/k.pem", "keyfile needs certfile"),
        ("amqps://", "needs a host"),
        ("amqp://host/a/b", "must be written %2f"),
        ("amqp://host?auth_mechanism=magic", "auth_mechanism must be"),
        ("amqp://host#frag", "fragment"),
        ("amqp://host?heartbeat", "malformed query"),
    ],
)
def test_bad_uris_are_refused_with_a_reason(text: str, reason: str) -> None:
    with pytest.raises(UriInvalid, match=reason):
        parse_uri(text)


def test_the_password_is_never_shown() -> None:
    text = "amqp://alice:s3cret@host:5672/%2f?heartbeat=5"
    uri = parse_uri(text)
    assert "s3cret" not in str(uri) and "s3cret" not in repr(uri)
    assert str(uri) == "amqp://alice:********@host:5672/%2f?heartbeat=5"
    assert redact(text) == str(uri)
    assert redact("amqp://host/%2f") == "amqp://host/%2f"
    assert redact("not a uri [") == "not a uri ["
    with pytest.raises(UriInvalid) as caught:
        parse_uri("amqp://alice:s3cret@host:nope")
    assert "s3cret" not in str(caught.value)


def test_tls_parameters_build_the_context(tmp_path: Path) -> None:
    uri = parse_uri("amqps://host?verify=verify_none&server_name_indication=broker.example")
    assert uri.tls is not None and uri.tls.verify_mode == ssl.CERT_NONE
    assert not uri.tls.check_hostname
    assert uri.server_hostname == "broker.example"
    uri = parse_uri("amqps://host")
    assert uri.tls is not None and uri.tls.verify_mode == ssl.CERT_REQUIRED
    assert uri.tls.check_hostname and uri.server_hostname == "host"
    bad = tmp_path / "not-a-cert.pem"
    bad.write_text("garbage")
    with pytest.raises(UriInvalid, match="cannot read certfile"):
        parse_uri(f"amqps://host?certfile={bad}")
