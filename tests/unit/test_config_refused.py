"""The LavinMQ keys streamq refuses (streamq/config_refused.py): a ConfigError naming
the file, line, key and value with the reason, and their harmless values named in the
warning instead. That `streamq serve` exits non-zero on it is
tests/integration/test_config_effects.py's."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamq.config import Resolved, resolve, unsupported_warning
from streamq.config_ini import ConfigError
from streamq.config_keys import Flag


def _resolve(tmp_path: Path, text: str) -> Resolved:
    path = tmp_path / "lavinmq.ini"
    path.write_text(text)
    return resolve({"config": Flag(str(path), "--config")}, {})


@pytest.mark.parametrize(
    ("ini", "reason"),
    [
        ("[main]\nset_timestamp = true\n", ":2: [main] set_timestamp = true: streamq does not"),
        ("[amqp]\nset_timestamp = yes\n", "timestamp_in_ms"),
        ("[main]\ndefault_consumer_prefetch = 10\n", "basic.qos"),
        ("[amqp]\ndefault_consumer_prefetch = 0\n", "basic.qos"),
        ("[amqp]\nmax_consumers_per_channel = 5\n", "consumers of a channel"),
        ("[main]\nlog_exchange = true\n", "amq.lavinmq.log"),
        ("[oauth]\nverify_aud = false\n", "OAuth"),
        ("[replication]\nfollower = true\n", "[clustering]"),
        ("[sni:a.example]\ntls_key = /k.pem\n", "SNI"),
    ],
)
def test_keys_that_matter_are_refused(tmp_path: Path, ini: str, reason: str) -> None:
    with pytest.raises(ConfigError) as raised:
        _resolve(tmp_path, ini)
    assert reason in str(raised.value)


def test_their_harmless_values_are_warned_about(tmp_path: Path) -> None:
    resolved = _resolve(
        tmp_path,
        "[main]\nset_timestamp = false\ndefault_consumer_prefetch = 65535\n"
        "log_exchange = no\n[amqp]\nmax_consumers_per_channel = 0\n",
    )
    warning = unsupported_warning(resolved)
    assert warning is not None and "ignoring 4 setting(s)" in warning
