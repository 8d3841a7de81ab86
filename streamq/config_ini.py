"""A reader of INI files that keeps each setting's line number, for `streamq serve --config`.

Owns the file's syntax, which is LavinMQ's (`lavinmq.ini`): `[section]` headers, `key =
value` lines, comment lines starting with `;` or `#`, blank lines. A value is the rest of
the line after the first `=`, stripped; there are no inline comments (a `;` inside a value,
as in a cipher list, is part of it), no quoting and no continuation lines. It knows nothing
of what the keys mean (`streamq.config` does); configparser is not used because it keeps no
line numbers, which every error message here gives.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import BinaryIO, Final

FILE_BYTES_MAX: Final = 1 << 20  # a config file is a few KiB; a bigger one is a mistake
READ_CHUNK_BYTES: Final = 64 * 1024
_SECTION: Final = re.compile(r"^\[\s*([A-Za-z0-9_.:-]+)\s*\]$")  # ":": LavinMQ's [sni:HOST]
_KEY: Final = re.compile(r"^[A-Za-z0-9_.-]+$")


class ConfigError(Exception):
    """A configuration that `streamq serve` refuses; the message says where and why."""


@dataclass(frozen=True, slots=True)
class Entry:
    section: str
    key: str
    value: str
    line: int


def where(path: str, line: int, section: str, key: str) -> str:
    """`FILE:LINE: [section] key`, the prefix of every message about a setting."""
    return f"{path}:{line}: [{section}] {key}"


def _read_bounded(file: BinaryIO) -> bytes:
    """The file's bytes, or its first FILE_BYTES_MAX + 1 when it is bigger: read in
    READ_CHUNK_BYTES pieces, so that a small file does not cost a buffer of the limit
    (under ASan, the fuzz soak's, that allocation was most of each input's time)."""
    data = bytearray()
    while len(data) <= FILE_BYTES_MAX and (chunk := file.read(READ_CHUNK_BYTES)):
        data += chunk
    return bytes(data[: FILE_BYTES_MAX + 1])


def read_ini(path: str) -> list[Entry]:
    """The settings of the file at `path`, in file order.

    Raises ConfigError for a file that cannot be read, is too big or is not UTF-8, and for
    a line that is malformed: neither a section, a `key = value`, a comment nor blank; a
    key before any section; a key given twice in one section.
    """
    try:
        with open(path, "rb") as file:
            data = _read_bounded(file)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config file: {exc.strerror}") from None
    if len(data) > FILE_BYTES_MAX:
        raise ConfigError(f"{path}: larger than {FILE_BYTES_MAX} bytes: not a config file")
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    return parse_ini(path, text)


def parse_ini(path: str, text: str) -> list[Entry]:
    """The settings in `text` (the contents of `path`); raises ConfigError as read_ini."""
    entries: list[Entry] = []
    section: str | None = None
    seen: dict[tuple[str, str], int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in ";#":
            continue
        if (header := _SECTION.match(line)) is not None:
            section = header[1].lower()
            continue
        entry = _setting(path, number, section, line)
        first = seen.setdefault((entry.section, entry.key), number)
        if first != number:
            raise ConfigError(
                f"{where(path, number, entry.section, entry.key)}: given twice "
                f"(first on line {first})"
            )
        entries.append(entry)
    return entries


def _setting(path: str, number: int, section: str | None, line: str) -> Entry:
    key, equals, value = line.partition("=")
    key = key.strip()
    if not equals or not _KEY.match(key):
        raise ConfigError(
            f"{path}:{number}: not a section, a `key = value` line or a comment: {line[:80]!r}"
        )
    if section is None:
        raise ConfigError(f"{path}:{number}: {key}: a key before any [section]")
    return Entry(section, key.lower(), value.strip(), number)
