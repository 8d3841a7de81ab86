"""PROXY protocol headers, v1 (text) and v2 (binary), sans-IO.

Owns parsing the header a load balancer (HAProxy, AWS NLB, LavinMQ's `[amqp]
proxy_protocol` peers) puts in front of a connection's first byte to tell the client's
real address: `parse_header(data)` takes the bytes read so far and returns the header and
the number of bytes it took, or None while it needs more. It has no sockets and no clock
(amqp_gateway/listeners.py and mqtt_gateway/proxy.py read the bytes and bound the time);
everything after the header is the client's own and is not looked at here.

The format is HAProxy's doc/proxy-protocol.txt. A header is refused (ProxyHeaderError)
as soon as the bytes cannot start one: a connection without a header is closed at its
first read, not after the timeout. Limits: a v1 header is 107 bytes at most (the spec's
own bound); a v2 header's address block and TLVs V2_BLOCK_BYTES_MAX (the spec allows 64
KiB; what load balancers send is a few hundred bytes). Unknown TLV types are kept, not
refused (the spec: a receiver ignores the types it does not know).
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass
from typing import Final

V1_SIGNATURE: Final = b"PROXY "
V2_SIGNATURE: Final = b"\r\n\r\n\x00\r\nQUIT\n"
V1_HEADER_BYTES_MAX: Final = 107  # "PROXY TCP6 <39> <39> 65535 65535\r\n" (spec 2.1)
V2_FIXED_BYTES: Final = 16  # signature, version and command, family, length
V2_BLOCK_BYTES_MAX: Final = 2048
_V2_ADDRESS_BYTES: Final = {1: 12, 2: 36, 3: 216}  # by family: INET, INET6, UNIX
_V2_FAMILY_NAMES: Final = {0: "UNSPEC", 1: "TCP4", 2: "TCP6", 3: "UNIX"}
_V2_LOCAL: Final = 0x0
_V2_PROXY: Final = 0x1
_V2_STREAM: Final = 0x1
_V2_DGRAM: Final = 0x2
_UNIX_PATH_BYTES: Final = 108
_TLV_FIXED_BYTES: Final = 3  # type, length

Address = tuple[str, int]


class ProxyHeaderError(ValueError):
    """The bytes are not a valid PROXY header; the message says why."""


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    """A parsed header. `source` is the client, `destination` the address it dialled;
    both None when the connection's own addresses stand (v1 UNKNOWN, v2 LOCAL or an
    unspecified family: a health check of the balancer itself, or an unknown protocol)."""

    version: int
    family: str  # "TCP4", "TCP6", "UNIX", or "UNKNOWN" (v1) / "UNSPEC" (v2)
    source: Address | None
    destination: Address | None
    tlvs: tuple[tuple[int, bytes], ...] = ()


def parse_header(data: bytes | bytearray) -> tuple[ProxyHeader, int] | None:
    """The header at the start of `data` and its length in bytes; None if `data` is a
    valid start of one but not all of it. Raises ProxyHeaderError if it cannot be one."""
    if _is_start(data, V1_SIGNATURE):
        return _parse_v1(data)
    if _is_start(data, V2_SIGNATURE):
        return _parse_v2(data)
    raise ProxyHeaderError(f"no PROXY protocol header (the connection began {bytes(data[:8])!r})")


def _is_start(data: bytes | bytearray, signature: bytes) -> bool:
    if len(data) < len(signature):
        return signature.startswith(data)
    return data.startswith(signature)


def _parse_v1(data: bytes | bytearray) -> tuple[ProxyHeader, int] | None:
    end = data.find(b"\n", 0, V1_HEADER_BYTES_MAX)
    if end < 0:
        if len(data) >= V1_HEADER_BYTES_MAX:
            raise ProxyHeaderError(f"v1 header longer than {V1_HEADER_BYTES_MAX} bytes")
        return None
    if data[end - 1] != ord("\r"):
        raise ProxyHeaderError("v1 header not ended by CRLF")
    try:
        line = bytes(data[: end - 1]).decode("ascii")
    except UnicodeDecodeError:
        raise ProxyHeaderError("v1 header is not ASCII") from None
    return _v1_fields(line.split(" ")), end + 1


def _v1_fields(fields: list[str]) -> ProxyHeader:
    """PROXY <protocol> <source> <destination> <source port> <destination port>."""
    protocol = fields[1] if len(fields) > 1 else ""
    if protocol == "UNKNOWN":
        return ProxyHeader(1, "UNKNOWN", None, None)  # the rest of the line is ignored
    if protocol not in ("TCP4", "TCP6"):
        raise ProxyHeaderError(f"v1 header with unknown protocol {protocol!r}")
    if len(fields) != 6:
        raise ProxyHeaderError(f"v1 {protocol} header needs 6 fields, got {len(fields)}")
    version = 4 if protocol == "TCP4" else 6
    source = (_v1_address(fields[2], version), _v1_port(fields[4]))
    destination = (_v1_address(fields[3], version), _v1_port(fields[5]))
    return ProxyHeader(1, protocol, source, destination)


def _v1_address(text: str, version: int) -> str:
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        raise ProxyHeaderError(f"v1 header with a bad address {text!r}") from None
    if address.version != version:
        raise ProxyHeaderError(f"v1 TCP{version} header with an IPv{address.version} address")
    return str(address)


def _v1_port(text: str) -> int:
    if not (text.isdigit() and text.isascii() and len(text) <= 5 and int(text) <= 0xFFFF):
        raise ProxyHeaderError(f"v1 header with a bad port {text!r}")
    return int(text)


def _parse_v2(data: bytes | bytearray) -> tuple[ProxyHeader, int] | None:
    if len(data) < V2_FIXED_BYTES:
        return None
    version_command, family_transport, length = struct.unpack_from(">BBH", data, 12)
    if version_command >> 4 != 2:
        raise ProxyHeaderError(f"v2 header with version {version_command >> 4}")
    command = version_command & 0xF
    if command not in (_V2_LOCAL, _V2_PROXY):
        raise ProxyHeaderError(f"v2 header with unknown command {command}")
    if length > V2_BLOCK_BYTES_MAX:
        raise ProxyHeaderError(f"v2 header of {length} bytes, above {V2_BLOCK_BYTES_MAX}")
    end = V2_FIXED_BYTES + length
    if len(data) < end:
        return None
    block = bytes(data[V2_FIXED_BYTES:end])
    if command == _V2_LOCAL:
        # The spec: the receiver uses the connection's own endpoints and discards the
        # block, family included (a balancer's own health check).
        return ProxyHeader(2, "UNSPEC", None, None), end
    return _v2_proxy(family_transport, block), end


def _v2_proxy(family_transport: int, block: bytes) -> ProxyHeader:
    family, transport = family_transport >> 4, family_transport & 0xF
    name = _V2_FAMILY_NAMES.get(family)
    if name is None:
        raise ProxyHeaderError(f"v2 header with unknown address family {family}")
    if transport == _V2_DGRAM:
        raise ProxyHeaderError("v2 header for a datagram connection")
    if transport not in (0, _V2_STREAM):
        raise ProxyHeaderError(f"v2 header with unknown transport {transport}")
    address_bytes = _V2_ADDRESS_BYTES.get(family, 0)
    if len(block) < address_bytes:
        raise ProxyHeaderError(f"v2 {name} header with a {len(block)}-byte address block")
    tlvs = _v2_tlvs(block[address_bytes:])
    if family == 0:
        return ProxyHeader(2, name, None, None, tlvs)  # UNSPEC: the socket's own addresses
    source, destination = _v2_addresses(family, block)
    return ProxyHeader(2, name, source, destination, tlvs)


def _v2_addresses(family: int, block: bytes) -> tuple[Address, Address]:
    if family == 1:
        source_ip, destination_ip, source_port, destination_port = struct.unpack_from(
            ">4s4sHH", block
        )
        return (
            (str(ipaddress.IPv4Address(source_ip)), source_port),
            (str(ipaddress.IPv4Address(destination_ip)), destination_port),
        )
    if family == 2:
        source_ip, destination_ip, source_port, destination_port = struct.unpack_from(
            ">16s16sHH", block
        )
        return (
            (str(ipaddress.IPv6Address(source_ip)), source_port),
            (str(ipaddress.IPv6Address(destination_ip)), destination_port),
        )
    source_path = block[:_UNIX_PATH_BYTES].split(b"\0", 1)[0]
    destination_path = block[_UNIX_PATH_BYTES : 2 * _UNIX_PATH_BYTES].split(b"\0", 1)[0]
    return (
        (source_path.decode("utf-8", "replace"), 0),
        (destination_path.decode("utf-8", "replace"), 0),
    )


def _v2_tlvs(data: bytes) -> tuple[tuple[int, bytes], ...]:
    """The type-length-value entries after the addresses; each must fit the block."""
    tlvs = []
    position = 0
    while position < len(data):
        if len(data) - position < _TLV_FIXED_BYTES:
            raise ProxyHeaderError("v2 header with a truncated TLV")
        kind, length = struct.unpack_from(">BH", data, position)
        position += _TLV_FIXED_BYTES
        if position + length > len(data):
            raise ProxyHeaderError(f"v2 TLV 0x{kind:02x} of {length} bytes overruns its header")
        tlvs.append((kind, data[position : position + length]))
        position += length
    return tuple(tlvs)
