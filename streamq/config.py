"""`streamq serve`'s effective configuration: defaults, the config file, the environment and
the command line, merged in that order, each value remembering where it came from.

Owns the precedence (flags > environment > file > defaults), the validation of file and
environment values (a bad one is a ConfigError naming the file, line and key, or the
variable; so is a LavinMQ key that `streamq.config_refused` refuses), the one warning
about a config file's unsupported keys, the `--print-config` listing and the translation
into `streamq.app.ServeConfig`. The names are in `streamq.config_keys`, the file syntax in
`streamq.config_ini`. It starts nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from streamq.broker.resources import ResourceLimits
from streamq.config_ini import ConfigError, Entry, read_ini, where
from streamq.config_keys import (
    BIND_ENV,
    BIND_TARGETS,
    BUILT_IN,
    BY_INI,
    BY_NAME,
    CONFIG_ENV,
    KEYS,
    LAVINMQ_ONLY_SECTIONS,
    SECTION_ALIASES,
    SECTIONS,
    Flag,
    Key,
)
from streamq.config_refused import refusal
from streamq.config_values import boolean
from streamq.serve_config import ServeConfig

DEFAULT_SOURCE: Final = "default"
FILE_SOURCE: Final = "file "
TLS_PORTS: Final = ("amqps_port", "https_port", "streams_port", "mqtts_port")
BIND_FLAG: Final = "--bind"


@dataclass(frozen=True, slots=True)
class Setting:
    value: object
    text: str  # as it was written (shown by --print-config)
    source: str  # "default", "file F:LINE", "env NAME" or "flag --name"


@dataclass(slots=True)
class Resolved:
    settings: dict[str, Setting]
    config_file: Setting | None = None
    unsupported: list[str] = field(default_factory=list)  # "[mqtt] port (line 12)"

    def value(self, name: str) -> object:
        return self.settings[name].value

    def text(self, name: str) -> str:
        return self.settings[name].text


def resolve(flags: Mapping[str, Flag], environ: Mapping[str, str]) -> Resolved:
    """Merge the layers. `flags` maps key names (and "bind", "config") to what the command
    line gave; `environ` is the process environment.

    Raises ConfigError for an unreadable or malformed config file and for a bad value in
    the file or the environment (flag values were checked by the argument parser).
    """
    resolved = Resolved({key.name: _default(key) for key in KEYS})
    resolved.config_file = _config_file(flags, environ)
    if resolved.config_file is not None:
        _apply_file(resolved, resolved.config_file.text)
    _apply_environment(resolved, environ)
    _apply_flags(resolved, flags)
    _file_tls_ports_need_a_cert(resolved)
    return resolved


def _file_tls_ports_need_a_cert(resolved: Resolved) -> None:
    # LavinMQ opens its TLS listeners only when a certificate is configured, and ships a
    # lavinmq.ini with `tls_port = 5671` and the certificate commented out: such a file
    # starts streamq too, with the listener off and named in the warning. A TLS port asked
    # for by a flag or the environment is left for the listener to refuse without a cert.
    if resolved.text("tls_cert"):
        return
    for name in TLS_PORTS:
        setting = resolved.settings[name]
        if setting.source.startswith(FILE_SOURCE) and setting.value != -1:
            section, key = BY_NAME[name].ini[0]
            line = setting.source.rsplit(":", 1)[1]
            resolved.unsupported.append(
                f"[{section}] {key} = {setting.text} (line {line}; no tls_cert: the "
                "listener is off, as in LavinMQ)"
            )
            resolved.settings[name] = Setting(-1, "-1", f"{setting.source} without tls_cert")


def _default(key: Key) -> Setting:
    value = key.parse(key.default) if key.default else ""
    return Setting(value, key.default, DEFAULT_SOURCE)


def _config_file(flags: Mapping[str, Flag], environ: Mapping[str, str]) -> Setting | None:
    if "config" in flags:
        return Setting(flags["config"].text, flags["config"].text, "flag --config")
    if environ.get(CONFIG_ENV):
        return Setting(environ[CONFIG_ENV], environ[CONFIG_ENV], f"env {CONFIG_ENV}")
    return None


def _apply_file(resolved: Resolved, path: str) -> None:
    for entry in read_ini(path):
        section = SECTION_ALIASES.get(entry.section, entry.section)
        key = BY_INI.get((section, entry.key))
        if key is not None:
            source = f"{FILE_SOURCE}{path}:{entry.line}"
            resolved.settings[key.name] = _parsed(key, entry.value, source, _at(path, entry))
        elif (section, entry.key) in BUILT_IN:
            _check_built_in(resolved, path, entry, section)
        elif (refused := refusal(section, entry.key, entry.value)) is not None:
            raise ConfigError(f"{_at(path, entry)} = {entry.value}: {refused.reason}")
        elif section in SECTIONS or section in LAVINMQ_ONLY_SECTIONS:
            resolved.unsupported.append(f"[{entry.section}] {entry.key} (line {entry.line})")
        else:
            raise ConfigError(
                f"{_at(path, entry)}: unknown section [{entry.section}] (streamq reads "
                f"{', '.join(f'[{name}]' for name in SECTIONS)}; LavinMQ's others are "
                "ignored with a warning)"
            )


def _at(path: str, entry: Entry) -> str:
    return where(path, entry.line, entry.section, entry.key)


def _check_built_in(resolved: Resolved, path: str, entry: Entry, section: str) -> None:
    built_in = BUILT_IN[(section, entry.key)]
    try:
        value = boolean(entry.value)
    except ValueError as exc:
        raise ConfigError(f"{_at(path, entry)}: {exc}") from None
    if value != built_in:
        resolved.unsupported.append(
            f"[{entry.section}] {entry.key} = {entry.value} (line {entry.line}; streamq "
            f"always behaves as {str(built_in).lower()})"
        )


def _apply_environment(resolved: Resolved, environ: Mapping[str, str]) -> None:
    if BIND_ENV in environ:
        for name in BIND_TARGETS:
            key = BY_NAME[name]
            resolved.settings[name] = _parsed(
                key, environ[BIND_ENV], f"env {BIND_ENV}", f"environment variable {BIND_ENV}"
            )
    for key in KEYS:
        # The canonical name first: it beats an alias given as well.
        variable = next((name for name in key.env if name in environ), None)
        if variable is not None:
            resolved.settings[key.name] = _parsed(
                key, environ[variable], f"env {variable}", f"environment variable {variable}"
            )


def _apply_flags(resolved: Resolved, flags: Mapping[str, Flag]) -> None:
    if "bind" in flags:
        for name in BIND_TARGETS:
            resolved.settings[name] = _parsed(
                BY_NAME[name], flags["bind"].text, f"flag {BIND_FLAG}", BIND_FLAG
            )
    for key in KEYS:
        given = flags.get(key.name)
        if given is not None:
            resolved.settings[key.name] = _parsed(key, given.text, f"flag {given.flag}", given.flag)


def _parsed(key: Key, text: str, source: str, place: str) -> Setting:
    try:
        return Setting(key.parse(text), text, source)
    except ValueError as exc:
        raise ConfigError(f"{place}: {exc}") from None


def unsupported_warning(resolved: Resolved) -> str | None:
    """The one start-up warning naming the config file's keys that streamq ignores."""
    if not resolved.unsupported or resolved.config_file is None:
        return None
    return (
        f"config file {resolved.config_file.text}: ignoring {len(resolved.unsupported)} "
        f"setting(s) streamq does not support: {'; '.join(resolved.unsupported)}"
    )


def print_config(resolved: Resolved) -> str:
    """The effective configuration, one key a line: `name = value  (source)`."""
    rows = [(key.name, resolved.settings[key.name]) for key in KEYS]
    if resolved.config_file is not None:
        rows.insert(0, ("config", resolved.config_file))
    width = max(len(name) for name, _ in rows)
    value_width = min(40, max(len(setting.text) for _, setting in rows))
    return "".join(
        f"{name:<{width}} = {setting.text:<{value_width}}  ({setting.source})\n"
        for name, setting in rows
    )


def serve_config(resolved: Resolved) -> ServeConfig:
    """The ServeConfig that `streamq serve` runs with."""
    fields = {
        key.serve_field: resolved.value(key.name) for key in KEYS if key.serve_field is not None
    }
    limits = ResourceLimits(
        memory_high_watermark_bytes=_int(resolved.value("memory_high_watermark")),
        disk_free_limit_bytes=_int(resolved.value("disk_free_limit")),
    )
    return ServeConfig(limits=limits, **fields)  # type: ignore[arg-type]  # the table's parsers give each field its type; tests/unit/test_config.py checks every field


def _int(value: object) -> int:
    assert isinstance(value, int), value
    return value
