"""The replication link's TLS: the contexts of the clustering port, from the
`clustering_tls_*` settings.

Owns the rule "all three settings or none" and the two contexts a node needs: the server
one its replication listener uses when it leads (it requires a follower certificate
signed by clustering_tls_ca) and the client one its follower uses (it requires the
leader's certificate signed by the same CA, for the host name of the leader's advertised
URI). The leader checks only the chain of a follower's certificate: followers have no
name it could expect (their node id is random), so any holder of a certificate from that
CA may follow, once it also knows the cluster secret. The contexts are built at start
and again on `reload()` (SIGHUP): the listener and the follower read them at each new
connection, so open connections keep the pair they started with. It opens no socket.
"""

from __future__ import annotations

import logging
import ssl
from typing import Final

from streamq.app import ServeConfig, ServeError
from streamq.tls import TlsError, mutual_context

logger = logging.getLogger("streamq")

SETTINGS: Final = ("clustering_tls_cert", "clustering_tls_key", "clustering_tls_ca")


class LinkTls:
    """The live contexts: `server` (the leader's listener: a follower certificate is
    required) and `client` (the follower's connection: checks the leader's host name)."""

    def __init__(self, config: ServeConfig) -> None:
        """Raises ServeError if a file does not load."""
        self.config = config
        self.server, self.client = _build(config)

    def reload(self) -> bool:
        """Read the three files again (SIGHUP). A pair that does not load is refused with
        a log line and the old contexts kept."""
        try:
            self.server, self.client = _build(self.config)
        except ServeError as exc:
            logger.error("%s; the old replication certificate stays in use", exc)
            return False
        logger.info("clustering TLS certificate reloaded from %s", self.config.clustering_tls_cert)
        return True


def link_tls(config: ServeConfig) -> LinkTls | None:
    """The contexts, or None when no clustering TLS setting is given (clear text).

    Raises ServeError when only some of the three are given, or a file does not load."""
    given = [name for name in SETTINGS if getattr(config, name)]
    if not given:
        return None
    if len(given) < len(SETTINGS):
        missing = [name for name in SETTINGS if name not in given]
        raise ServeError(
            f"clustering TLS needs clustering_tls_cert, clustering_tls_key and "
            f"clustering_tls_ca together (--clustering-tls-cert/-key/-ca, [clustering] "
            f"tls_cert/tls_key/tls_ca): {', '.join(given)} given without {', '.join(missing)}"
        )
    return LinkTls(config)


def _build(config: ServeConfig) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    files = {
        "cert": config.clustering_tls_cert,
        "key": config.clustering_tls_key,
        "ca": config.clustering_tls_ca,
    }
    try:
        server = mutual_context(server_side=True, **files, names=SETTINGS)
        client = mutual_context(server_side=False, **files, names=SETTINGS)
    except TlsError as exc:
        raise ServeError(f"clustering TLS: {exc}") from None
    client.check_hostname = True
    return server, client
