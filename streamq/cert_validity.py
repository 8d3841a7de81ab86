"""The validity period of the certificates in a PEM file, read without a TLS library.

Owns reading `notBefore` and `notAfter` out of each certificate of a PEM file (the
certificate-expiration health check, `http_gateway/health_api.py`): base64 to DER, then a
walk down the first fields of the X.509 structure (RFC 5280 section 4.1: Certificate,
tbsCertificate, its optional version, serialNumber, signature, issuer, then Validity).
Python's `ssl` module reads validity only of a peer's certificate, and a dependency for
two dates is not worth it. It checks no signature and trusts nothing it reads: every
length is bounded by the bytes present, and a malformed entry is an error, not a crash.
"""

from __future__ import annotations

import base64
import binascii
import calendar
import re
from dataclasses import dataclass
from typing import Final

PEM_BYTES_MAX: Final = 1 << 20  # a certificate file larger than this is refused
PEM_ENTRY: Final = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----\r?\n(.*?)-----END \1-----", re.DOTALL)
CERTIFICATE: Final = b"CERTIFICATE"
# Private keys may share the certificate file (`tls_key` unset): not certificates, not errors.
KEY_ENTRIES: Final = frozenset({b"PRIVATE KEY", b"EC PRIVATE KEY", b"RSA PRIVATE KEY"})
SEQUENCE: Final = 0x30
VERSION_TAG: Final = 0xA0  # [0] EXPLICIT, the optional version field
UTC_TIME: Final = 0x17
GENERALIZED_TIME: Final = 0x18


class CertificateUnreadable(ValueError):
    """A PEM entry that is not a certificate or whose DER cannot be read."""


@dataclass(frozen=True, slots=True)
class Validity:
    """One certificate's period, in seconds since the epoch (UTC)."""

    not_before_s: int
    not_after_s: int


def _header(der: bytes, at: int) -> tuple[int, int, int]:
    """(tag, start of the contents, end of the contents) of the DER element at `at`."""
    if at + 2 > len(der):
        raise CertificateUnreadable("truncated DER")
    tag, first = der[at], der[at + 1]
    at += 2
    if first < 0x80:
        length = first
    else:
        count = first & 0x7F
        if count == 0 or count > 4 or at + count > len(der):
            raise CertificateUnreadable("bad DER length")
        length = int.from_bytes(der[at : at + count], "big")
        at += count
    if at + length > len(der):
        raise CertificateUnreadable("truncated DER")
    return tag, at, at + length


def _time_s(tag: int, text: bytes) -> int:
    """UTCTime (YYMMDDHHMMSSZ, years 1950-2049 per RFC 5280) or GeneralizedTime."""
    match = re.fullmatch(rb"(\d{2}|\d{4})(\d{2})(\d{2})(\d{2})(\d{2})(\d{2})Z", text)
    if match is None or (tag == UTC_TIME) != (len(match[1]) == 2):
        raise CertificateUnreadable(f"bad time {text!r}")
    year = int(match[1])
    if tag == UTC_TIME:
        year += 1900 if year >= 50 else 2000
    fields = (year, *(int(match[i]) for i in range(2, 7)))
    return calendar.timegm((*fields, 0, 0, 0))


def validity(der: bytes) -> Validity:
    """The validity of the DER certificate `der`. Raises CertificateUnreadable."""
    tag, at, _ = _header(der, 0)
    if tag != SEQUENCE:
        raise CertificateUnreadable("not a certificate")
    tag, at, end = _header(der, at)  # tbsCertificate
    if tag != SEQUENCE:
        raise CertificateUnreadable("not a certificate")
    fields: list[tuple[int, int, int]] = []
    while at < end and len(fields) < 5:
        field = _header(der, at)
        fields.append(field)
        at = field[2]
    if fields and fields[0][0] == VERSION_TAG:
        fields.pop(0)
    if len(fields) < 4 or fields[3][0] != SEQUENCE:  # serial, signature, issuer, validity
        raise CertificateUnreadable("no validity")
    _, start, stop = fields[3]
    times = []
    for _ in range(2):
        tag, start, after = _header(der, start)
        if tag not in (UTC_TIME, GENERALIZED_TIME) or after > stop:
            raise CertificateUnreadable("bad validity")
        times.append(_time_s(tag, der[start:after]))
        start = after
    return Validity(times[0], times[1])


def read_pem(path: str) -> list[Validity | str]:
    """Each certificate of the PEM file at `path`, in order: its validity, or the reason
    it cannot be read. Private keys are passed over. Raises OSError (the file cannot be
    read) and CertificateUnreadable (no PEM entry at all, or too large a file)."""
    with open(path, "rb") as file:
        pem = file.read(PEM_BYTES_MAX + 1)
    if len(pem) > PEM_BYTES_MAX:
        raise CertificateUnreadable("the certificate file is too large")
    entries = PEM_ENTRY.findall(pem)
    if not entries:
        raise CertificateUnreadable("The certificate file provided does not contain any PEM entry.")
    found: list[Validity | str] = []
    for kind, body in entries:
        if kind in KEY_ENTRIES:
            continue
        if kind != CERTIFICATE:
            found.append(f"The certificate file provided contains a {kind.decode()} entry")
            continue
        try:
            found.append(validity(base64.b64decode(body)))
        except (CertificateUnreadable, binascii.Error) as exc:
            found.append(f"The certificate cannot be read: {exc}")
    return found
