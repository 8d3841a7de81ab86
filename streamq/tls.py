"""TLS for the broker's listeners: the server contexts, their reload, the TLS accept.

Owns the `ssl.SSLContext`s that the AMQPS and HTTPS listeners hand out (built from
`ServeConfig`'s tls_* fields, LavinMQ's names), their reload on SIGHUP, and the accept
path of a TLS listener: a plain TCP accept, then a handshake bounded by
HANDSHAKE_TIMEOUT_S, then the listener's own protocol (the AMQP session, the management
app) on the TLS transport, exactly as over TCP. A failed or stalled handshake is logged
with the peer's address and closed; the listener goes on. It must not parse protocol
bytes.

Rule: a context is never changed once a listener serves it. A reload builds new contexts
from the files, and only when both build does it swap them in; handshakes in progress and
open connections keep the pair they started with.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, cast

from uvloop.loop import SSLProtocol  # type: ignore[attr-defined]  # not in uvloop's stubs

if TYPE_CHECKING:
    from streamq.serve_config import ServeConfig

logger = logging.getLogger(__name__)

# A client must finish its handshake within this (RabbitMQ's ssl_handshake_timeout is 5 s,
# LavinMQ's socket timeout 10 s); read at each accept, so tests can shorten it.
HANDSHAKE_TIMEOUT_S: Final = 10.0
MIN_VERSIONS: Final = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}

ProtocolFactory = Callable[[], asyncio.BaseProtocol]


class TlsError(Exception):
    """A TLS setting or file the broker cannot use (names the setting and the file)."""


def _no_password() -> str:
    # OpenSSL would otherwise ask for an encrypted key's passphrase on the terminal.
    raise TlsError("the private key is encrypted: give an unencrypted key")


def build_context(config: ServeConfig, *, verify_peer: bool) -> ssl.SSLContext:
    """A server context from the tls_* settings; `verify_peer` asks every client for a
    certificate signed by tls_ca_cert (RabbitMQ's verify_peer + fail_if_no_peer_cert).

    Raises TlsError for a bad version, cipher list, certificate, key or CA file."""
    if config.tls_min_version not in MIN_VERSIONS:
        raise TlsError(f"tls_min_version must be 1.2 or 1.3, not {config.tls_min_version!r}")
    if not config.tls_cert:
        raise TlsError("a TLS port needs tls_cert (--cert), the server certificate")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = MIN_VERSIONS[config.tls_min_version]
    context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE | ssl.OP_NO_COMPRESSION
    if config.tls_ciphers:
        try:
            context.set_ciphers(config.tls_ciphers)
        except ssl.SSLError:
            raise TlsError(f"tls_ciphers {config.tls_ciphers!r}: no cipher matches") from None
    _load_pair(context, config.tls_cert, config.tls_key)
    if verify_peer:
        _load_ca(context, config.tls_ca_cert)
    return context


def _load_pair(context: ssl.SSLContext, cert: str, key: str) -> None:
    try:
        context.load_cert_chain(cert, key or None, password=_no_password)
    except OSError as exc:  # ssl.SSLError is an OSError too
        raise TlsError(f"tls_cert {cert!r} / tls_key {key!r}: {_why(exc)}") from None


def _load_ca(context: ssl.SSLContext, ca_cert: str) -> None:
    if not ca_cert:
        raise TlsError("tls_verify_peer needs tls_ca_cert (--cacert), the clients' CA")
    try:
        context.load_verify_locations(cafile=ca_cert)
    except OSError as exc:
        raise TlsError(f"tls_ca_cert {ca_cert!r}: {_why(exc)}") from None
    context.verify_mode = ssl.CERT_REQUIRED


class TlsContexts:
    """The live contexts: `amqps` (client certificates when tls_verify_peer) and `https`
    (never asks for one: browsers reach the management UI without), and their reload."""

    def __init__(self, config: ServeConfig) -> None:
        """Raises TlsError if the settings or files are unusable."""
        self.config = config
        self.amqps, self.https = self._build()

    def _build(self) -> tuple[ssl.SSLContext, ssl.SSLContext]:
        verify = self.config.tls_verify_peer
        return build_context(self.config, verify_peer=verify), build_context(
            self.config, verify_peer=False
        )

    def reload(self) -> bool:
        """Read the certificate and key files again (SIGHUP). New handshakes use the new
        pair; open connections keep theirs. A pair that does not load (missing file, key
        not matching) is refused with a log line and the old one kept."""
        try:
            amqps, https = self._build()
        except TlsError as exc:
            logger.error("TLS reload refused, the old certificate stays in use: %s", exc)
            return False
        self.amqps, self.https = amqps, https
        logger.info("TLS certificate reloaded from %s", self.config.tls_cert)
        return True


class _TlsProtocol(SSLProtocol):  # type: ignore[misc]  # SSLProtocol is untyped (Any)
    """uvloop's TLS protocol (what its create_server(ssl=...) makes), which also keeps
    the peer's address for the log line of a failed handshake."""

    peer = "?"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.peer = _address(transport.get_extra_info("peername"))
        super().connection_made(transport)


def _accept(
    factory: ProtocolFactory, context: Callable[[], ssl.SSLContext], what: str
) -> asyncio.BaseProtocol:
    # As uvloop's own TLS server does (streamserver.pyx), but the waiter is ours: it
    # tells a failed or stalled handshake, which uvloop logs only in debug mode.
    loop = asyncio.get_running_loop()
    waiter = loop.create_future()
    protocol = _TlsProtocol(
        loop,
        factory(),
        context(),
        waiter,
        server_side=True,
        server_hostname=None,
        ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S,
    )
    waiter.add_done_callback(lambda done: _handshake_done(protocol, what, done))
    return cast(asyncio.BaseProtocol, protocol)


def _handshake_done(protocol: _TlsProtocol, what: str, done: asyncio.Future[None]) -> None:
    if done.cancelled() or (exc := done.exception()) is None:
        return
    # uvloop has closed the connection already (SSLProtocol._fatal_error).
    logger.warning("%s: TLS handshake with %s failed: %s", what, protocol.peer, _why(exc))


def _address(peer: object) -> str:
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)


def _why(exc: BaseException) -> str:
    """OpenSSL's reason in words ("key values mismatch", "certificate verify failed:
    certificate has expired"), or the OS's ("No such file or directory")."""
    if isinstance(exc, ssl.SSLCertVerificationError) and exc.verify_message:
        return f"certificate verify failed: {exc.verify_message}"
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason).lower().replace("_", " ")
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


async def serve_tls(
    factory: ProtocolFactory,
    host: str,
    port: int,
    context: Callable[[], ssl.SSLContext],
    what: str,
    *,
    start_serving: bool = True,
) -> asyncio.Server:
    """Listen on host:port; each connection gets `context()`'s TLS, then a protocol from
    `factory`. `what` names the listener in log lines; `start_serving` False: bound,
    accepting only after `start_serving()`. Raises OSError if it cannot bind."""
    loop = asyncio.get_running_loop()
    return await loop.create_server(
        lambda: _accept(factory, context, what),
        host,
        port,
        reuse_address=True,
        start_serving=start_serving,
    )


def mutual_context(
    *, server_side: bool, cert: str, key: str, ca: str, names: tuple[str, str, str]
) -> ssl.SSLContext:
    """A context for a link whose two ends each show a certificate signed by `ca` and
    verify the other's (the clustering port): CERT_REQUIRED on both sides, TLS 1.2 at
    least. A client context checks no host name (the caller turns that on with the name
    it dials). `names` are the settings named in errors (cert, key, CA).

    Raises TlsError for a certificate, key or CA file that does not load."""
    purpose = ssl.PROTOCOL_TLS_SERVER if server_side else ssl.PROTOCOL_TLS_CLIENT
    context = ssl.SSLContext(purpose)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_COMPRESSION
    try:
        context.load_cert_chain(cert, key, password=_no_password)
    except OSError as exc:
        raise TlsError(f"{names[0]} {cert!r} / {names[1]} {key!r}: {_why(exc)}") from None
    try:
        context.load_verify_locations(cafile=ca)
    except OSError as exc:
        raise TlsError(f"{names[2]} {ca!r}: {_why(exc)}") from None
    context.check_hostname = False
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def failure_reason(exc: BaseException) -> str:
    """A TLS or socket failure in words, as the listeners' log lines give it."""
    return _why(exc)
