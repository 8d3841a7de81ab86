"""streamq/log_output.py: the JSON and journald line formats, and the journal's detection
from JOURNAL_STREAM against a real pipe's device and inode."""

from __future__ import annotations

import datetime
import json
import logging
import os
import sys
from collections.abc import Iterator

import pytest

from streamq import config_values
from streamq.log_fields import FieldsLogger
from streamq.log_output import (
    JsonFormatter,
    formatter,
    journal_stream,
    priority,
    rfc3339_utc,
)


def record(
    level: int = logging.INFO, message: str = "hello %s", *args: object, **extra: object
) -> logging.LogRecord:
    made = logging.LogRecord("streamq.test", level, __file__, 1, message, args or ("you",), None)
    made.__dict__.update(extra)
    return made


def test_json_line_has_time_level_logger_message_and_fields() -> None:
    line = JsonFormatter().format(record(connection="a -> b", vhost="/", queue="q"))
    assert "\n" not in line
    parsed = json.loads(line)
    assert list(parsed)[:4] == ["time", "level", "logger", "message"]
    assert parsed["level"] == "info"
    assert parsed["logger"] == "streamq.test"
    assert parsed["message"] == "hello you"
    assert (parsed["connection"], parsed["vhost"], parsed["queue"]) == ("a -> b", "/", "q")
    assert "args" not in parsed and "msg" not in parsed and "lineno" not in parsed


def test_json_time_is_rfc3339_utc_with_microseconds() -> None:
    text = rfc3339_utc(1_780_000_000.123456)
    assert text.endswith("Z") and len(text.split(".")[1]) == len("123456Z")
    parsed = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    assert parsed.tzinfo == datetime.UTC
    assert abs(parsed.timestamp() - 1_780_000_000.123456) < 1e-5


def test_json_escapes_newlines_and_keeps_its_own_keys_over_fields() -> None:
    parsed = json.loads(JsonFormatter().format(record(logging.INFO, "two\nlines %s")))
    assert parsed["message"] == "two\nlines you"
    made = record()
    made.__dict__["logger"] = "a field named as a key"
    assert json.loads(JsonFormatter().format(made))["logger"] == "streamq.test"


def test_json_exception_from_exc_info_and_from_a_field() -> None:
    logger = logging.getLogger("streamq.test.exc")
    captured: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = captured.append  # type: ignore[method-assign]  # keep the records
    logger.addHandler(handler)
    try:
        try:
            raise ValueError("broken")
        except ValueError as exc:
            logger.exception("failed")
            logger.error("failed: %s", exc, extra={"exception": exc})
    finally:
        logger.removeHandler(handler)
    for made in captured:
        parsed = json.loads(JsonFormatter().format(made))
        assert parsed["exception"]["type"] == "ValueError"
        assert parsed["exception"]["message"] == "broken"
        trace = parsed["exception"]["traceback"]
        assert trace.startswith("Traceback") and "raise ValueError" in trace


def test_fields_logger_merges_scope_and_call_fields() -> None:
    captured: list[logging.LogRecord] = []
    logger = logging.getLogger("streamq.test.fields")
    handler = logging.Handler()
    handler.emit = captured.append  # type: ignore[method-assign]  # keep the records
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        scoped = FieldsLogger(logger, connection="c1")
        scoped.fields["user"] = "guest"
        scoped.info("one", extra={"channel": 3})
        scoped.info("two")
    finally:
        logger.removeHandler(handler)
    first, second = (json.loads(JsonFormatter().format(r)) for r in captured)
    assert (first["connection"], first["user"], first["channel"]) == ("c1", "guest", 3)
    assert "channel" not in second and second["user"] == "guest"


def test_journal_text_prefixes_every_line_and_drops_the_time() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        made = record(logging.ERROR)
        made.exc_info = sys.exc_info()
    lines = formatter("text", journal=True).format(made).split("\n")
    assert lines[0] == "<3>ERROR streamq.test: hello you"
    assert len(lines) > 2 and all(line.startswith("<3>") for line in lines)
    plain = formatter("text", journal=False).format(record())
    assert plain[:4].isdigit() and plain.endswith("INFO streamq.test: hello you")


def test_journal_json_keeps_the_object_after_the_prefix() -> None:
    line = formatter("json", journal=True).format(record(logging.WARNING))
    assert line.startswith("<4>{")
    assert json.loads(line[3:])["level"] == "warning"


@pytest.mark.parametrize(
    ("level", "expected"),
    [(logging.DEBUG, 7), (logging.INFO, 6), (logging.WARNING, 4), (logging.ERROR, 3),
     (logging.CRITICAL, 2), (5, 7), (25, 6), (45, 3)],
)  # fmt: skip
def test_syslog_priorities(level: int, expected: int) -> None:
    assert priority(level) == expected


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    read_fd, write_fd = os.pipe()
    yield read_fd, write_fd
    os.close(read_fd)
    os.close(write_fd)


def test_journal_stream_matches_only_the_named_device_and_inode(pipe: tuple[int, int]) -> None:
    _, write_fd = pipe
    info = os.fstat(write_fd)
    with os.fdopen(os.dup(write_fd), "w") as stream:
        assert journal_stream(stream, {"JOURNAL_STREAM": f"{info.st_dev}:{info.st_ino}"})
        assert not journal_stream(stream, {"JOURNAL_STREAM": f"{info.st_dev}:{info.st_ino + 1}"})
        assert not journal_stream(stream, {"JOURNAL_STREAM": "garbage"})
        assert not journal_stream(stream, {})


def test_unknown_format_is_refused() -> None:
    assert config_values.log_format(" JSON ") == "json"
    with pytest.raises(ValueError, match="not a log format: 'xml' \\(text or json\\)"):
        config_values.log_format("xml")
    with pytest.raises(ValueError, match="not a log format"):
        formatter("xml", journal=False)
