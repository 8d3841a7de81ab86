"""Domain errors of the broker core. The gateway maps each to a protocol code in one table
(`amqp_gateway/errormap.py`); the code RabbitMQ uses is noted on each class."""

from __future__ import annotations


class BrokerError(Exception):
    """Base class of broker core errors."""


class NotFound(BrokerError):
    """AMQP 404: the exchange or queue does not exist."""

    def __init__(self, kind: str, name: str, vhost: str) -> None:
        super().__init__(f"no {kind} '{name}' in vhost '{vhost}'")


class QueueUnavailable(BrokerError):
    """AMQP 404, as RabbitMQ answers for a queue whose process is down: the queue's data
    could not be read (a corrupt or unreadable file); it can only be deleted."""

    def __init__(self, name: str, vhost: str, reason: str) -> None:
        super().__init__(f"queue '{name}' in vhost '{vhost}' is unavailable: {reason}")


class MessageReadFailed(QueueUnavailable):
    """AMQP 404 as QueueUnavailable (RabbitMQ's code for a queue it cannot serve now),
    HTTP 503: reading a message of the queue failed with an I/O error (EIO). Only that
    read failed: the queue goes on, the message stays in it, a later read may work."""

    def __init__(self, name: str, vhost: str, reason: str) -> None:
        BrokerError.__init__(
            self, f"queue '{name}' in vhost '{vhost}': {reason}; the message stays queued"
        )


class PreconditionFailed(BrokerError):
    """AMQP 406: inequivalent redeclare, bad argument, queue in use or not empty."""


class AccessRefused(BrokerError):
    """AMQP 403: reserved names, the default exchange, exclusive consumers."""


class ResourceLocked(BrokerError):
    """AMQP 405: an exclusive queue of another connection."""


class CommandInvalid(BrokerError):
    """AMQP 503 (a connection error): for example an unknown exchange type."""


class NotAllowed(BrokerError):
    """AMQP 530: vhost missing or refused."""
