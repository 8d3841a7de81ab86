"""The states of an AMQP connection and of its channels, and the tables over them.

Owns the life cycle the connection state machine (amqp_gateway/connection.py) walks
through, as h11's `_state.py` does: which connection-class method each handshake state
expects, RabbitMQ's names for the states (its reply texts show them), and the states in
which an error closes the socket without a close handshake. No transitions happen here:
the state machine makes them; this module holds the values and the tables it reads.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Final

from amqp_gateway.codec import methods as m


class State(IntEnum):
    AWAIT_HEADER = 0
    AWAIT_START_OK = 1
    AWAIT_TUNE_OK = 2
    AWAIT_OPEN = 3
    OPEN = 4
    CLOSING = 5  # we sent connection.close and wait for close-ok
    CLOSED = 6


class ChannelState(IntEnum):
    OPEN = 0
    CLOSING = 1  # we sent channel.close and wait for close-ok


# The one connection-class method each handshake state takes (besides the close ones).
EXPECTED_METHOD: Final[dict[State, type[m.Method]]] = {
    State.AWAIT_START_OK: m.ConnectionStartOk,
    State.AWAIT_TUNE_OK: m.ConnectionTuneOk,
    State.AWAIT_OPEN: m.ConnectionOpen,
}
# RabbitMQ's names of the connection states, which its reply texts show.
RABBITMQ_STATE_NAMES: Final[dict[State, str]] = {
    State.AWAIT_START_OK: "starting",
    State.AWAIT_TUNE_OK: "tuning",
    State.AWAIT_OPEN: "opening",
    State.OPEN: "running",
}
# Before tune-ok, RabbitMQ 3.10 answers an error by closing the socket without
# connection.close (rabbit_reader:handle_exception/3, after a 3 s pause against login
# floods), but for a refused login when the client announced
# authentication_failure_close. The spec asks as much of a bad mechanism and of a
# tune-ok above the server's limits ("close the connection without attempting a
# negotiated close").
SILENT_STATES: Final = frozenset({State.AWAIT_START_OK, State.AWAIT_TUNE_OK})
