"""Fuzz the definitions import (streamq/broker/definitions_import.py): a definitions file
loaded at boot (`load_definitions`) or posted to `POST /api/definitions`, into a real
broker (tests/fuzz/broker_host.py).

An input is `mode | bytes`. With mode < 128 the bytes are the file; else they are edits
(tests/fuzz/json_shapes.py) to one of the seed documents, which is written out as JSON:
byte mutations alone rarely get past the JSON syntax. The file is read as
`load_definitions` reads it (`read_definitions_file`) and imported into the broker. The
property: the only errors are DefinitionsInvalid and the broker's other domain errors
(BrokerError: a queue declared twice with other arguments, a bad policy...), which
`load_definitions` and the HTTP API report; no other exception, and nothing logged with
a traceback.

Run: pytest tests/fuzz/test_definitions.py (bounded), or
python -m tests.fuzz.soak definitions -runs=1000000 (atheris soak, tools/fuzz.sh).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from typing import Final

from streamq.broker.definitions_import import Importer, read_definitions_file
from streamq.broker.errors import BrokerError
from tests.fuzz.broker_host import BrokerHost, scratch
from tests.fuzz.harness import bounded_run, seeds
from tests.fuzz.json_shapes import JSON, edited

CORPUS: Final = "definitions"
EXAMPLES: Final = 2400
INPUTS_PER_BROKER: Final = 500
# In memory where there is room (tests/fuzz/broker_host.py): the file is written and read
# back for every input, and on a disk the two opens cost more than the import.
_DIRECTORY: Final = tempfile.mkdtemp(prefix="streamq-fuzz-definitions-", dir=scratch())
atexit.register(shutil.rmtree, _DIRECTORY, ignore_errors=True)
_PATH: Final = os.path.join(_DIRECTORY, "d.json")
STRUCTURED: Final = 128
_host: BrokerHost | None = None
_documents: list[JSON] = []


def documents() -> list[JSON]:
    """The seed documents (each seed is `mode | JSON`)."""
    if not _documents:
        for seed in seeds(CORPUS):
            try:
                _documents.append(json.loads(seed[1:]))
            except ValueError:
                continue
    return _documents


def host() -> BrokerHost:
    global _host  # noqa: PLW0603 - one broker for the whole run, opened on first use
    if _host is None:
        _host = BrokerHost(INPUTS_PER_BROKER)
    return _host


def fuzz_one(data: bytes) -> None:
    if not data:
        return
    structured = data[0] >= STRUCTURED
    text = json.dumps(edited(data[1:], documents())).encode() if structured else data[1:]
    with open(_PATH, "wb") as file:
        file.write(text)
    broker_host = host()
    broker = broker_host.next_input()
    try:
        document = read_definitions_file(_PATH)
        broker_host.run(Importer(broker, document, None).run())
    except BrokerError as exc:  # DefinitionsInvalid is one
        assert str(exc), "a refusal says why"
    assert not broker_host.logged_errors()


def test_definitions_bounded() -> None:
    bounded_run(fuzz_one, CORPUS, EXAMPLES)
