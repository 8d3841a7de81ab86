"""Certificates for the replication link's TLS tests: a CA, and node certificates that
serve as both ends of the link (serverAuth and clientAuth, for 127.0.0.1 and localhost
unless told), made with `openssl` as tests/integration/certs.py makes its own."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.integration.certs import Pair, make_ca, openssl

NODE_EXTENSIONS = """basicConstraints = CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth, clientAuth
subjectAltName = {san}
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""
LOOPBACK_SAN = "IP:127.0.0.1, DNS:localhost"


def node_pair(directory: Path, ca: Pair, name: str, san: str = LOOPBACK_SAN) -> Pair:
    """A node certificate signed by `ca`, valid for `san` (OpenSSL's subjectAltName)."""
    pair = Pair(directory / f"{name}.pem", directory / f"{name}.key")
    openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
            "-out", str(pair.key))  # fmt: skip
    request = directory / f"{name}.csr"
    openssl("req", "-new", "-key", str(pair.key), "-out", str(request), "-subj", f"/CN={name}")
    extfile = directory / f"{name}.ext"
    extfile.write_text(NODE_EXTENSIONS.format(san=san))
    openssl(
        "x509", "-req", "-in", str(request), "-CA", str(ca.cert), "-CAkey", str(ca.key),
        "-CAcreateserial", "-out", str(pair.cert), "-days", "30", "-extfile", str(extfile),
    )  # fmt: skip
    return pair


@dataclass(frozen=True)
class NodeFiles:
    """One node's three clustering TLS settings."""

    cert: Path
    key: Path
    ca: Path

    def flags(self) -> tuple[str, ...]:
        return (
            "--clustering-tls-cert", str(self.cert),
            "--clustering-tls-key", str(self.key),
            "--clustering-tls-ca", str(self.ca),
        )  # fmt: skip


def cluster_files(directory: Path, count: int) -> tuple[Pair, list[NodeFiles]]:
    """A CA and `count` node certificates from it."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = make_ca(directory, "cluster-ca")
    nodes = [node_pair(directory, ca, f"node{i}") for i in range(count)]
    return ca, [NodeFiles(pair.cert, pair.key, ca.cert) for pair in nodes]
