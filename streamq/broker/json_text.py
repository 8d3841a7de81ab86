"""JSON documents that peers send: management API bodies and definitions files.

Owns one rule on top of `json.loads`: a string (key or value) must be Unicode text, so a
lone surrogate escape (`"\\ud800"`, valid JSON syntax, not a character: RFC 8259 section
8.2 leaves its meaning undefined) is refused here, where the document is parsed, with the
other syntax errors. Further in, names and argument values are encoded as UTF-8 (with
`surrogateescape` for the octets AMQP carries), which a lone surrogate breaks. Found by
fuzzing (docs/fuzzing.md). It knows neither HTTP nor files.
"""

from __future__ import annotations

import json
import re
from typing import Final

# Only a \u escape can make a surrogate (raw UTF-8 cannot encode one): documents without
# one of U+D800-U+DFFF skip the walk.
_SURROGATE_ESCAPE: Final = re.compile(rb"\\u[dD][89a-fA-F]")


def loads(data: bytes | str) -> object:
    """`json.loads(data)`. Raises ValueError for what json.loads refuses and for a string
    or key holding a lone surrogate."""
    document = json.loads(data)
    raw = data.encode() if isinstance(data, str) else data
    if _SURROGATE_ESCAPE.search(raw) is not None:
        _check(document)
    return document


def _check(value: object) -> None:
    # An explicit stack, not recursion: documents nest as deep as json.loads allows.
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            _check_text(item)
        elif isinstance(item, dict):
            for key, member in item.items():
                _check_text(key)
                stack.append(member)
        elif isinstance(item, list):
            stack.extend(item)


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"a string holds a lone surrogate (U+{ord(text[exc.start]):04X}), not Unicode text"
        ) from None
