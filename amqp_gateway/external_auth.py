"""SASL EXTERNAL: a TLS client logs in as its certificate's common name.

Owns what RabbitMQ's rabbitmq_auth_mechanism_ssl does, with `ssl_cert_login_from =
common_name`: which mechanisms connection.start offers on a transport (EXTERNAL only when
the client presented a certificate that the TLS handshake verified, as the plugin's
`should_offer/1`: never on plain TCP), and the EXTERNAL login itself. The user named by
the certificate subject's CN must exist; no password is checked (a user without one may
log in this way), and that user's permissions apply as after any login. It reads the
transport's TLS details only; the handshake and its verification belong to streamq/tls.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Final

from amqp_gateway.events import LoginRequested
from amqp_gateway.handshake import MECHANISMS
from streamq.broker.accounts import AccountStore
from streamq.broker.users import User
from streamq.tls_peer import certificate_cn

EXTERNAL: Final = "EXTERNAL"
MECHANISMS_WITH_EXTERNAL: Final = MECHANISMS + b" " + EXTERNAL.encode()


def offered_mechanisms(transport: asyncio.BaseTransport) -> bytes:
    """The mechanisms to offer in connection.start on this transport."""
    return MECHANISMS_WITH_EXTERNAL if certificate_cn(transport) is not None else MECHANISMS


def certificate_login(
    event: LoginRequested, transport: asyncio.BaseTransport | None
) -> LoginRequested:
    """An EXTERNAL login names the certificate's CN as its user (the client's response
    is not read, as RabbitMQ's plugin does not read it); other logins pass unchanged."""
    if event.mechanism != EXTERNAL:
        return event
    return dataclasses.replace(event, username=certificate_cn(transport) or "")


def authenticate_login(accounts: AccountStore, event: LoginRequested) -> User | None:
    """The user the login is for, or None when refused: EXTERNAL needs only the user to
    exist (the TLS handshake proved the name), PLAIN and AMQPLAIN the password."""
    if event.mechanism == EXTERNAL:
        return accounts.user(event.username) if event.username else None
    return accounts.authenticate(event.username, event.password)
