"""What a finished TLS handshake tells about the peer, for every gateway.

Owns `certificate_cn` (the user name of AMQP's and the stream protocol's EXTERNAL
mechanism) and `tls_fields` (the management API's TLS fields of a connection, RabbitMQ's
names; `transport_tls_fields` from a connection's transport, for every gateway's client
view). Reads the transport's or SSL object's details only: the handshake and its
verification belong to streamq/tls.py, which imports the serve config and so sits above
the gateways; this module imports nothing of the broker.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Final


def certificate_cn(transport: asyncio.BaseTransport | None) -> str | None:
    """The first common name in the subject of the client's verified certificate; None
    without TLS, without a client certificate or without a CN."""
    cert = transport.get_extra_info("peercert") if transport is not None else None
    if not isinstance(cert, dict):
        return None  # plain TCP, or TLS without verify_peer: the certificate was not asked
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName" and value:
                return str(value)
    return None


# Certificate name attributes as RabbitMQ writes them in peer_cert_subject/issuer.
_NAME_KEYS: Final = {
    "commonName": "CN",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
}


def transport_tls_fields(transport: asyncio.BaseTransport | None) -> dict[str, object] | None:
    """`tls_fields` of a connection's transport; None when it is not TLS (or gone)."""
    ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
    return tls_fields(ssl_object) if isinstance(ssl_object, ssl.SSLObject) else None


def tls_fields(ssl_object: ssl.SSLObject) -> dict[str, object]:
    """RabbitMQ's TLS fields of a connection: the protocol ("tlsv1.3"), OpenSSL's cipher
    suite name, and the client certificate's subject, issuer and validity when one was
    verified (tls_verify_peer); key exchange and hash are not split out of the suite."""
    cipher = ssl_object.cipher()
    version = ssl_object.version()
    cert = ssl_object.getpeercert()
    return {
        "ssl_protocol": version.lower() if version else None,
        "ssl_key_exchange": None,
        "ssl_cipher": cipher[0] if cipher else None,
        "ssl_hash": None,
        "peer_cert_subject": _cert_name(cert.get("subject")) if cert else None,
        "peer_cert_issuer": _cert_name(cert.get("issuer")) if cert else None,
        "peer_cert_validity": f"{cert['notBefore']} - {cert['notAfter']}" if cert else None,
    }


def _cert_name(name: object) -> str | None:
    if not isinstance(name, tuple):
        return None
    parts = [f"{_NAME_KEYS.get(key, key)}={value}" for rdn in name for key, value in rdn]
    return ",".join(parts)
