"""JSON from peers refuses lone surrogates where it is parsed (streamq/broker/json_text.py).

Regression of a fuzz finding (docs/fuzzing.md): a queue redeclared through the management
API or a definitions import with an argument `"\\ud800"` reached the equivalence check,
whose UTF-8 encoding raised UnicodeEncodeError: an HTTP 500, an import that failed with a
traceback. Now the body or file is refused as not JSON text.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamq.broker import json_text
from streamq.broker.broker import Broker
from streamq.broker.definitions_import import (
    DefinitionsInvalid,
    Importer,
    read_definitions_file,
)


@pytest.mark.parametrize(
    "text",
    [
        '"\\ud800"',
        '{"arguments": {"x-max-length": "\\udfff"}}',
        '{"\\uDBFF": 1}',
        '[[{"a": ["x\\udc80"]}]]',
        '"\\ud83d"',  # a high surrogate without its low half
    ],
)
def test_lone_surrogates_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="lone surrogate"):
        json_text.loads(text.encode())


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('"\\ud83d\\ude00"', "\U0001f600"),  # a pair is one character
        ('{"k": "\\u00e9\\u0041"}', {"k": "éA"}),
        ('"plain"', "plain"),
    ],
)
def test_text_and_surrogate_pairs_are_kept(text: str, expected: object) -> None:
    assert json_text.loads(text.encode()) == expected
    assert json_text.loads(text) == expected


def test_syntax_errors_are_still_value_errors() -> None:
    with pytest.raises(ValueError, match="Expecting"):
        json_text.loads(b"{")


async def test_a_definitions_file_redeclaring_a_queue_with_a_surrogate_is_refused(
    tmp_path: Path,
) -> None:
    broker = Broker(str(tmp_path / "data"), direct_io=False)
    try:
        first = {"queues": [{"name": "q", "vhost": "/", "arguments": {"x-max-length": 5}}]}
        await Importer(broker, first, None).run()
        path = tmp_path / "definitions.json"
        path.write_text(json.dumps(first).replace("5", '"\\ud800"'))
        with pytest.raises(DefinitionsInvalid, match="lone surrogate"):
            read_definitions_file(str(path))
    finally:
        await broker.aclose()
