"""streamq.proxy_protocol: PROXY protocol v1 and v2 headers as HAProxy's
doc/proxy-protocol.txt writes them, fed whole, split at every byte and one byte at a
time, with what follows the header left untouched, and every malformed or oversized
header refused with a reason."""

from __future__ import annotations

import ipaddress
import struct

import pytest

from streamq.proxy_protocol import (
    V1_HEADER_BYTES_MAX,
    V2_BLOCK_BYTES_MAX,
    V2_SIGNATURE,
    ProxyHeader,
    ProxyHeaderError,
    parse_header,
)

AMQP = b"AMQP\x00\x00\x09\x01"


def v2(
    command: int = 1,
    family: int = 0x11,
    block: bytes = b"",
    version: int = 2,
    length: int | None = None,
) -> bytes:
    size = len(block) if length is None else length
    return V2_SIGNATURE + bytes([version << 4 | command, family]) + struct.pack(">H", size) + block


def inet4(source: str, destination: str, source_port: int, destination_port: int) -> bytes:
    return (
        ipaddress.IPv4Address(source).packed
        + ipaddress.IPv4Address(destination).packed
        + struct.pack(">HH", source_port, destination_port)
    )


def inet6(source: str, destination: str, source_port: int, destination_port: int) -> bytes:
    return (
        ipaddress.IPv6Address(source).packed
        + ipaddress.IPv6Address(destination).packed
        + struct.pack(">HH", source_port, destination_port)
    )


def unix(source: bytes, destination: bytes) -> bytes:
    return source.ljust(108, b"\0") + destination.ljust(108, b"\0")


def tlv(kind: int, value: bytes) -> bytes:
    return struct.pack(">BH", kind, len(value)) + value


def parse_each_way(header: bytes) -> ProxyHeader:
    """Parse `header` followed by AMQP bytes: whole, then cut at every byte (None until
    the cut reaches its end), then fed a byte at a time; all agree, and the length
    returned is the header's, so what follows goes to the session unchanged."""
    whole = parse_header(header + AMQP)
    assert whole is not None
    parsed, size = whole
    assert size == len(header)
    for cut in range(1, len(header)):
        assert parse_header(header[:cut]) is None, cut
    data = bytearray()
    result = None
    for byte in header:
        assert result is None
        data.append(byte)
        result = parse_header(data)
    assert result == (parsed, len(header))
    return parsed


def test_v1_tcp4() -> None:
    header = parse_each_way(b"PROXY TCP4 192.0.2.10 198.51.100.1 56324 5672\r\n")
    assert header == ProxyHeader(1, "TCP4", ("192.0.2.10", 56324), ("198.51.100.1", 5672))


def test_v1_tcp6_is_normalised() -> None:
    header = parse_each_way(b"PROXY TCP6 2001:db8:0:0::1 ::1 65535 0\r\n")
    assert header.family == "TCP6"
    assert header.source == ("2001:db8::1", 65535)
    assert header.destination == ("::1", 0)


def test_v1_longest_header_fits_the_limit() -> None:
    address = "ffff:" * 7 + "fffe"
    line = f"PROXY TCP6 {address} {address} 65535 65535\r\n".encode()
    assert len(line) == V1_HEADER_BYTES_MAX - 3  # the spec's 107 counts the longest form
    assert parse_each_way(line).source == (address, 65535)


def test_v1_unknown_keeps_the_socket_addresses() -> None:
    assert parse_each_way(b"PROXY UNKNOWN\r\n") == ProxyHeader(1, "UNKNOWN", None, None)
    # The spec: with UNKNOWN the receiver ignores whatever follows up to the CRLF.
    assert parse_each_way(b"PROXY UNKNOWN ffff::1 ffff::2 1 2\r\n").source is None


def test_v2_proxy_inet4_with_tlvs() -> None:
    tlvs = tlv(0x01, b"amqp") + tlv(0xEA, b"vpce-0123") + tlv(0x04, b"")
    block = inet4("203.0.113.7", "10.0.0.1", 40000, 5672) + tlvs
    header = parse_each_way(v2(block=block))
    assert header == ProxyHeader(
        2,
        "TCP4",
        ("203.0.113.7", 40000),
        ("10.0.0.1", 5672),
        ((0x01, b"amqp"), (0xEA, b"vpce-0123"), (0x04, b"")),
    )


def test_v2_proxy_inet6() -> None:
    header = parse_each_way(v2(family=0x21, block=inet6("2001:db8::7", "::1", 1234, 5672)))
    assert header.family == "TCP6"
    assert header.source == ("2001:db8::7", 1234)
    assert header.destination == ("::1", 5672)


def test_v2_proxy_unix_addresses() -> None:
    header = parse_each_way(v2(family=0x31, block=unix(b"/run/client.sock", b"/run/lb.sock")))
    assert header.family == "UNIX"
    assert header.source == ("/run/client.sock", 0)
    assert header.destination == ("/run/lb.sock", 0)


def test_v2_local_keeps_the_socket_addresses_and_skips_its_block() -> None:
    # LOCAL: a balancer's health check. Its block (here an address and junk) is
    # discarded, family included, as the spec says.
    header = parse_each_way(v2(command=0, family=0x11, block=b"\x01" * 20))
    assert header == ProxyHeader(2, "UNSPEC", None, None)


def test_v2_proxy_unspec_keeps_the_socket_addresses() -> None:
    header = parse_each_way(v2(family=0x00, block=tlv(0x05, b"id-1")))
    assert header.source is None
    assert header.tlvs == ((0x05, b"id-1"),)


def test_v2_largest_block_fits_the_limit() -> None:
    padding = V2_BLOCK_BYTES_MAX - 12 - 3
    block = inet4("192.0.2.1", "192.0.2.2", 1, 2) + tlv(0x04, b"\0" * padding)
    result = parse_header(v2(block=block) + AMQP)
    assert result is not None
    assert result[1] == 16 + V2_BLOCK_BYTES_MAX


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (AMQP, "no PROXY protocol header"),
        (b"GET / HTTP/1.1\r\n", "no PROXY protocol header"),
        (b"PROXZ", "no PROXY protocol header"),
        (b"\r\n\r\n\x00\r\nQUIX", "no PROXY protocol header"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n", "not ended by CRLF"),
        (b"PROXY TCP5 1.2.3.4 5.6.7.8 1 2\r\n", "unknown protocol 'TCP5'"),
        (b"PROXY \r\n", "unknown protocol ''"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n", "needs 6 fields, got 5"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n", "needs 6 fields, got 7"),
        (b"PROXY TCP4 1.2.3.4  5.6.7.8 1 2\r\n", "needs 6 fields"),
        (b"PROXY TCP4 1.2.3.400 5.6.7.8 1 2\r\n", "bad address '1.2.3.400'"),
        (b"PROXY TCP4 ::1 5.6.7.8 1 2\r\n", "TCP4 header with an IPv6 address"),
        (b"PROXY TCP6 ::1 5.6.7.8 1 2\r\n", "TCP6 header with an IPv4 address"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n", "bad port '65536'"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 -1 2\r\n", "bad port '-1'"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 +2\r\n", "bad port '\\+2'"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 \xd9\xa1 2\r\n", "not ASCII"),
        (b"PROXY " + b"x" * 120, "longer than 107 bytes"),
        (b"PROXY TCP4 " + b"1" * 95 + b"\r\n", "longer than 107 bytes"),
        (v2(version=1), "v2 header with version 1"),
        (v2(command=2), "unknown command 2"),
        (v2(family=0x41, block=b"\0" * 12), "unknown address family 4"),
        (v2(family=0x12, block=inet4("1.2.3.4", "5.6.7.8", 1, 2)), "datagram"),
        (v2(family=0x13, block=inet4("1.2.3.4", "5.6.7.8", 1, 2)), "unknown transport 3"),
        (v2(family=0x11, block=b"\0" * 11), "TCP4 header with a 11-byte address block"),
        (v2(family=0x21, block=b"\0" * 35), "TCP6 header with a 35-byte address block"),
        (v2(family=0x31, block=b"\0" * 215), "UNIX header with a 215-byte address block"),
        (v2(length=V2_BLOCK_BYTES_MAX + 1), "2049 bytes, above 2048"),
        (v2(length=0xFFFF), "65535 bytes, above 2048"),
        (v2(block=inet4("1.2.3.4", "5.6.7.8", 1, 2) + b"\x01\x00"), "truncated TLV"),
        (v2(block=inet4("1.2.3.4", "5.6.7.8", 1, 2) + tlv(1, b"ab")[:-1]), "overruns"),
    ],
)
def test_malformed_headers_are_refused_with_a_reason(data: bytes, reason: str) -> None:
    with pytest.raises(ProxyHeaderError, match=reason):
        parse_header(data)


def test_an_oversized_v2_header_is_refused_before_its_block_arrives() -> None:
    # The length field alone decides: nothing of the block needs to be read (or held).
    with pytest.raises(ProxyHeaderError, match="above"):
        parse_header(v2(length=V2_BLOCK_BYTES_MAX + 1)[:16])


def test_a_connection_without_a_header_is_refused_at_its_first_bytes() -> None:
    # A plain AMQP client on a PROXY listener: refused at once, not after the timeout.
    with pytest.raises(ProxyHeaderError):
        parse_header(b"A")
    assert parse_header(b"") is None
    assert parse_header(b"P") is None
    assert parse_header(b"\r") is None
