"""streamq.cert_validity against openssl: the dates it reads out of certificates that the
`openssl` command made are the ones `openssl x509 -dates` prints (UTCTime before 2050,
GeneralizedTime after), keys beside certificates are passed over, other entries are
named, and no input of bytes makes it fail other than with CertificateUnreadable."""

from __future__ import annotations

import base64
import calendar
import contextlib
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamq.cert_validity import CertificateUnreadable, Validity, read_pem, validity
from tests.integration import certs

OPENSSL_DATE = "%b %d %H:%M:%S %Y GMT"


def openssl_dates(path: Path) -> Validity:
    out = certs.openssl("x509", "-in", str(path), "-noout", "-startdate", "-enddate")
    fields = dict(line.split("=", 1) for line in out.strip().splitlines())

    def seconds(text: str) -> int:
        return calendar.timegm(time.strptime(" ".join(text.split()), OPENSSL_DATE))

    return Validity(seconds(fields["notBefore"]), seconds(fields["notAfter"]))


@pytest.mark.parametrize("days", [1, 365, 10000])  # 10000 days: past 2049, GeneralizedTime
def test_dates_match_openssl(tmp_path: Path, days: int) -> None:
    ca = certs.make_ca(tmp_path, "ca")
    leaf = certs.issue(tmp_path, ca, "leaf", days=days)
    assert read_pem(str(leaf.cert)) == [openssl_dates(leaf.cert)]


def test_a_chain_gives_each_certificate_and_keys_are_passed_over(tmp_path: Path) -> None:
    ca = certs.make_ca(tmp_path, "ca")
    leaf = certs.issue(tmp_path, ca, "leaf", days=30)
    bundle = tmp_path / "bundle.pem"
    bundle.write_text(leaf.cert.read_text() + leaf.key.read_text() + ca.cert.read_text())
    assert read_pem(str(bundle)) == [openssl_dates(leaf.cert), openssl_dates(ca.cert)]


def test_other_entries_are_named_and_no_entry_is_refused(tmp_path: Path) -> None:
    ca = certs.make_ca(tmp_path, "ca")
    request = tmp_path / "mixed.pem"
    request.write_text(
        ca.cert.read_text() + "-----BEGIN X509 CRL-----\nAAAA\n-----END X509 CRL-----\n"
    )
    found = read_pem(str(request))
    assert found[1] == "The certificate file provided contains a X509 CRL entry"
    empty = tmp_path / "empty.pem"
    empty.write_text("nothing here\n")
    with pytest.raises(CertificateUnreadable, match="does not contain any PEM entry"):
        read_pem(str(empty))


def test_a_damaged_certificate_is_a_reason_not_a_crash(tmp_path: Path) -> None:
    ca = certs.make_ca(tmp_path, "ca")
    lines = ca.cert.read_text().splitlines()
    damaged = tmp_path / "damaged.pem"
    damaged.write_text("\n".join([lines[0], lines[1][:8], lines[-1]]) + "\n")
    (reason,) = read_pem(str(damaged))
    assert isinstance(reason, str) and reason.startswith("The certificate cannot be read")


@given(st.binary(max_size=300))
def test_any_bytes_are_read_or_refused(der: bytes) -> None:
    with contextlib.suppress(CertificateUnreadable):
        validity(der)


def test_every_truncation_and_flipped_byte_of_a_real_certificate(tmp_path: Path) -> None:
    ca = certs.make_ca(tmp_path, "ca")
    der = base64.b64decode("".join(ca.cert.read_text().splitlines()[1:-1]))
    assert validity(der) == openssl_dates(ca.cert)
    for cut in range(len(der)):
        with pytest.raises(CertificateUnreadable):
            validity(der[:cut])
    for at in range(len(der)):
        damaged = der[:at] + bytes([der[at] ^ 0xFF]) + der[at + 1 :]
        with contextlib.suppress(CertificateUnreadable):
            validity(damaged)
