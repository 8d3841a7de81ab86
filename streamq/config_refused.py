"""The LavinMQ settings `streamq serve` refuses to start with: those whose being ignored
would change safety or what clients see.

Owns the rule and the list. A LavinMQ key streamq does not have is refused (a ConfigError:
the process exits non-zero, naming the file, line and key) when ignoring it would weaken
authentication, TLS, durability or a limit an operator relies on, or would change the
messages and deliveries clients get; such a key is accepted only with the value that
means what streamq does anyway (`set_timestamp = false`), and then named in the start-up
warning like the cosmetic keys (buffer sizes, statistics intervals, listeners streamq
does not open). docs/configuration.md lists both. Pure data and one lookup; it reads no
file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

_FALSE: Final = frozenset({"false", "no", "n", "off", "0"})


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a key is refused, and the values (lower case) that mean streamq's behaviour."""

    reason: str
    harmless: frozenset[str] = frozenset()


_TIMESTAMP: Final = Refusal(
    "streamq does not add the timestamp_in_ms header to published messages", _FALSE
)
_PREFETCH: Final = Refusal(
    "streamq sets no prefetch on consumers of channels without basic.qos; set basic.qos "
    "in the clients (65535, LavinMQ's default, is accepted with a warning)",
    frozenset({"65535"}),
)
REFUSED_KEYS: Final = {
    ("main", "set_timestamp"): _TIMESTAMP,
    ("amqp", "set_timestamp"): _TIMESTAMP,
    ("main", "default_consumer_prefetch"): _PREFETCH,
    ("amqp", "default_consumer_prefetch"): _PREFETCH,
    ("amqp", "max_consumers_per_channel"): Refusal(
        "streamq does not limit the consumers of a channel", frozenset({"0"})
    ),
    ("main", "log_exchange"): Refusal(
        "streamq has no amq.lavinmq.log exchange to publish its log to", _FALSE
    ),
}
# Every key of these sections is refused.
REFUSED_SECTIONS: Final = {
    "oauth": Refusal(
        "streamq has no OAuth 2.0 authentication: tokens and scopes would not be checked "
        "as configured"
    ),
    "replication": Refusal(
        "[replication] is LavinMQ's old name for [clustering] (LavinMQ refuses it too); "
        "use [clustering]"
    ),
}


SNI_PREFIX: Final = "sni:"  # LavinMQ's [sni:HOST]: a certificate per server name
SNI: Final = Refusal(
    "streamq has no certificates per server name (SNI): its listeners present the one "
    "tls_cert; a client verifying another host name would fail"
)


def refusal(section: str, key: str, value: str) -> Refusal | None:
    """Why `[section] key = value` keeps streamq from starting; None if it does not."""
    if section.startswith(SNI_PREFIX):
        return SNI
    found = REFUSED_SECTIONS.get(section) or REFUSED_KEYS.get((section, key))
    if found is None or value.strip().lower() in found.harmless:
        return None
    return found
