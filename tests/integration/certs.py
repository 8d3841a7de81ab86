"""Real certificates for the TLS tests, made with the `openssl` command line in a directory.

A CA (optionally an intermediate under it), server certificates for 127.0.0.1 and
localhost, client certificates with a chosen CN, and expired ones (`-days -1`: valid until
a day before now). Keys are P-256 EC keys, quick to make.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

OPENSSL_TIMEOUT_S = 30
CA_EXTENSIONS = """basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""
SERVER_EXTENSIONS = """basicConstraints = CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1, DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""
CLIENT_EXTENSIONS = """basicConstraints = CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path

    def serial(self) -> int:
        out = openssl("x509", "-in", str(self.cert), "-noout", "-serial")
        return int(out.strip().split("=", 1)[1], 16)


def openssl(*args: str) -> str:
    done = subprocess.run(
        ["openssl", *args], check=False, capture_output=True, text=True, timeout=OPENSSL_TIMEOUT_S
    )
    assert done.returncode == 0, f"openssl {' '.join(args)}: {done.stderr}"
    return done.stdout


def _new_key(key: Path) -> None:
    openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(key))


def make_ca(directory: Path, name: str) -> Pair:
    """A self-signed root CA named `name`, valid for a year."""
    pair = Pair(directory / f"{name}.pem", directory / f"{name}.key")
    _new_key(pair.key)
    openssl(
        "req", "-x509", "-new", "-key", str(pair.key), "-out", str(pair.cert),
        "-subj", f"/CN={name}", "-days", "365",
    )  # fmt: skip
    return pair


def issue(
    directory: Path, ca: Pair, name: str, *, kind: str = "server", cn: str = "", days: int = 365
) -> Pair:
    """A certificate signed by `ca`: kind "server" (127.0.0.1, localhost), "client" or
    "ca" (an intermediate CA); `days=-1` makes an expired one."""
    extensions = {"server": SERVER_EXTENSIONS, "client": CLIENT_EXTENSIONS, "ca": CA_EXTENSIONS}
    pair = Pair(directory / f"{name}.pem", directory / f"{name}.key")
    _new_key(pair.key)
    request = directory / f"{name}.csr"
    subject = f"/CN={cn or name}"
    openssl("req", "-new", "-key", str(pair.key), "-out", str(request), "-subj", subject)
    extfile = directory / f"{name}.ext"
    extfile.write_text(extensions[kind])
    openssl(
        "x509", "-req", "-in", str(request), "-CA", str(ca.cert), "-CAkey", str(ca.key),
        "-CAcreateserial", "-out", str(pair.cert), "-days", str(days), "-extfile", str(extfile),
    )  # fmt: skip
    return pair


def chain(directory: Path, name: str, *pairs: Pair) -> Path:
    """One PEM file with the certificates of `pairs`, in order (leaf first)."""
    path = directory / f"{name}.pem"
    path.write_text("".join(pair.cert.read_text() for pair in pairs))
    return path
