"""Argument parsing of `streamq ctl`: global flags anywhere, verb flags, bad usage."""

from __future__ import annotations

import argparse

import pytest

from streamq.broker.users import check_password
from streamq.cli import build_parser, main
from streamq.ctlhttp import commands
from streamq.ctlhttp.client import (
    DEFAULT_URI,
    EXIT_ERROR,
    EXIT_NOPERM,
    URI_ENV,
    CtlError,
    Endpoint,
    _status_error,
    path,
)
from streamq.ctlhttp.entities import exchange_body, queue_arguments


def parse(*argv: str) -> argparse.Namespace:
    args = build_parser().parse_args(["ctl", *argv])
    commands.resolve_vhost(args)
    return args


def test_defaults() -> None:
    args = parse("list_queues")
    assert args.uri is None
    assert (args.vhost, args.vhost_given) == ("/", False)
    assert args.output_format == "table"
    assert args.timeout_s == 10
    assert args.data_dir is None
    assert args.columns == []


@pytest.mark.parametrize(
    "argv",
    [
        ("--uri", "http://a:b@h:1", "-p", "v", "--format", "json", "list_queues"),
        ("list_queues", "--uri", "http://a:b@h:1", "-p", "v", "--json"),
        ("-U", "http://a:b@h:1", "list_queues", "--vhost=v", "-f", "json"),
    ],
)
def test_global_flags_go_before_or_after_the_verb(argv: tuple[str, ...]) -> None:
    args = parse(*argv)
    assert (args.uri, args.vhost, args.vhost_given) == ("http://a:b@h:1", "v", True)
    assert args.output_format == "json"


def test_a_flag_after_the_verb_wins() -> None:
    args = parse("-p", "one", "--timeout", "2", "list_queues", "-p", "two")
    assert args.vhost == "two"
    assert args.timeout_s == 2  # given before the verb only: kept


def test_list_verbs_take_columns() -> None:
    assert parse("list_queues", "name", "messages").columns == ["name", "messages"]


def test_create_queue_flags_become_arguments() -> None:
    args = parse(
        "create_queue",
        "q",
        "--durable",
        "--expires",
        "1000",
        "--max-length",
        "5",
        "--message-ttl",
        "60",
        "--delivery-limit",
        "3",
        "--reject-on-overflow",
        "--dead-letter-exchange",
        "dlx",
        "--dead-letter-routing-key",
        "dead",
    )
    assert (args.name, args.durable, args.auto_delete) == ("q", True, False)
    assert queue_arguments(args) == {
        "x-expires": 1000,
        "x-max-length": 5,
        "x-message-ttl": 60,
        "x-delivery-limit": 3,
        "x-overflow": "reject-publish",
        "x-dead-letter-exchange": "dlx",
        "x-dead-letter-routing-key": "dead",
    }


def test_a_plain_queue_has_no_arguments() -> None:
    assert queue_arguments(parse("create_queue", "q")) == {}
    assert queue_arguments(parse("create_queue", "s", "--stream-queue")) == {
        "x-queue-type": "stream"
    }


def test_create_exchange_body() -> None:
    args = parse("create_exchange", "topic", "events", "--durable", "--alternate-exchange", "ae")
    assert exchange_body(args) == {
        "type": "topic",
        "durable": True,
        "auto_delete": False,
        "internal": False,
        "arguments": {"alternate-exchange": "ae"},
    }


def test_delayed_exchange_routes_as_its_type() -> None:
    body = exchange_body(parse("create_exchange", "direct", "later", "--delayed", "--internal"))
    assert body["type"] == "x-delayed-message"
    assert body["arguments"] == {"x-delayed-type": "direct"}
    assert body["internal"] is True


def test_set_policy_defaults_and_flags() -> None:
    args = parse("set_policy", "p", "^s", "{}")
    assert (args.priority, args.apply_to) == (0, "all")
    args = parse("set_policy", "p", "^s", "{}", "--priority", "3", "--apply-to", "streams")
    assert (args.name, args.pattern, args.definition) == ("p", "^s", "{}")
    assert (args.priority, args.apply_to) == (3, "streams")


def test_optional_positionals() -> None:
    assert parse("close_connection", "c1").reason is None
    assert parse("close_connection", "c1", "maintenance").reason == "maintenance"
    assert parse("export_definitions").file is None
    assert parse("set_user_tags", "bob").tags == []


@pytest.mark.parametrize(
    "argv",
    [
        (),
        ("no_such_verb",),
        ("add_user", "bob"),
        ("list_users", "extra"),
        ("create_queue", "q", "--max-length", "-1"),
        ("create_queue", "q", "--expires", "soon"),
        ("list_queues", "--format", "xml"),
        ("list_queues", "--timeout", "0"),
        ("set_policy", "p", "^s", "{}", "--apply-to", "everything"),
        ("create_exchange", "direct"),
        ("import_definitions",),
    ],
)
def test_bad_usage_exits_2(argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["ctl", *argv])
    assert exited.value.code == 2
    assert "usage: streamq" in capsys.readouterr().err


def test_every_verb_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    for verb in commands.VERBS:
        with pytest.raises(SystemExit) as exited:
            build_parser().parse_args(["ctl", verb.name, "--help"])
        assert exited.value.code == 0
        assert f"usage: streamq ctl {verb.name}" in capsys.readouterr().out


def test_hash_password_needs_no_broker(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ctl", "--uri", "http://nowhere.invalid", "hash_password", "s3cret"]) == 0
    assert check_password("s3cret", capsys.readouterr().out.strip())


def test_online_only_verbs_refuse_a_data_dir(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ctl", "--data-dir", "/nonexistent/d", "list_queues"]) == 2
    assert capsys.readouterr().err == (
        "streamq ctl: list_queues needs a running broker: leave out --data-dir "
        "(which serves only the user, vhost and permission verbs)\n"
    )


def test_data_dir_and_uri_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ctl", "--data-dir", "d", "--uri", "http://h:1", "list_users"]) == 2
    assert "not both" in capsys.readouterr().err


def test_bad_uri_is_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ctl", "--uri", "amqp://guest:guest@h", "list_users"]) == 2
    assert capsys.readouterr().err == (
        "streamq ctl: --uri must be http://user:password@host:port, got 'amqp://guest:guest@h'\n"
    )


def test_uri_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(URI_ENV, "ftp://from-env")
    assert main(["ctl", "list_users"]) == 2
    assert "'ftp://from-env'" in capsys.readouterr().err


def test_endpoint_parsing() -> None:
    assert Endpoint.parse(DEFAULT_URI) == Endpoint("http", "127.0.0.1", 15672, "guest", "guest")
    assert Endpoint.parse("http://localhost") == Endpoint(
        "http", "localhost", 15672, "guest", "guest"
    )
    bob = Endpoint.parse("https://bob:p%40ss%3Aw@example.com:443")
    assert bob == Endpoint("https", "example.com", 443, "bob", "p@ss:w")
    assert str(bob) == "example.com:443"
    with pytest.raises(CtlError, match="bad --uri"):
        Endpoint.parse("http://h:99999")


def test_paths_encode_each_segment_whole() -> None:
    assert path("queues", "/", "a b/c") == "/api/queues/%2F/a%20b%2Fc"
    assert path("users", "bob") == "/api/users/bob"


@pytest.mark.parametrize(
    ("status", "body", "message", "exit_status"),
    [
        (400, b'{"error": "bad_request", "reason": "bad x"}', "400: bad x", EXIT_ERROR),
        (
            404,
            b'{"error": "Object Not Found", "reason": "Not Found"}',
            "404: Not Found",
            EXIT_ERROR,
        ),
        (
            401,
            b'{"error": "not_authorised", "reason": "Login failed"}',
            "401: Login failed",
            EXIT_NOPERM,
        ),
        (403, b'{"reason": "Access refused"}', "403: Access refused", EXIT_NOPERM),
        (502, b"<html>bad gateway</html>", "502: <html>bad gateway</html>", EXIT_ERROR),
        (500, b"", "500: Internal Server Error", EXIT_ERROR),
    ],
)
def test_status_errors(status: int, body: bytes, message: str, exit_status: int) -> None:
    error = _status_error(status, body)
    assert (str(error), error.exit_status, error.status) == (message, exit_status, status)
