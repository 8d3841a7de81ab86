"""The one table from broker-core domain errors to AMQP exceptions (STYLE.md section 5)."""

from __future__ import annotations

from typing import Final

from amqp_gateway import errors
from streamq.broker import errors as domain
from streamq.broker.account_limits import QueueLimitReached
from streamq.log.errors import LogError

_TABLE: Final[dict[type[domain.BrokerError], type[errors.AMQPError]]] = {
    domain.NotFound: errors.NotFound,
    domain.QueueUnavailable: errors.NotFound,
    domain.MessageReadFailed: errors.NotFound,
    domain.PreconditionFailed: errors.PreconditionFailed,
    domain.AccessRefused: errors.AccessRefused,
    domain.ResourceLocked: errors.ResourceLocked,
    domain.CommandInvalid: errors.CommandInvalid,
    domain.NotAllowed: errors.NotAllowed,
    QueueLimitReached: errors.PreconditionFailed,
}


def to_amqp(exc: domain.BrokerError | LogError, class_id: int, method_id: int) -> errors.AMQPError:
    """The AMQP exception for a domain error raised while handling a method."""
    if isinstance(exc, LogError):
        # The vhost's message store failed (corrupt or unwritable): RabbitMQ's code for a
        # server-side resource problem is 506, a connection error.
        return errors.ResourceError(f"message store failed: {exc}", class_id, method_id)
    kind = _TABLE.get(type(exc), errors.InternalError)
    return kind(str(exc), class_id, method_id)
