"""Fuzz the PROXY protocol v1/v2 header parser (streamq/proxy_protocol.py), which
reads the first bytes of a connection on a listener with `proxy_protocol` on.

An input is the bytes of a connection's start, fed as the listener does: the whole of
what was read so far, one growing prefix after another, until the parser returns a
header or refuses. The property: only ProxyHeaderError is raised; a header's length is
within the bytes given and within the spec's bounds (107 bytes for v1, 16 plus
V2_BLOCK_BYTES_MAX for v2); "need more" (None) is never the answer past those bounds,
so a peer cannot make the listener buffer more; and the answer for a prefix agrees with
the answer for all the bytes (the same header, or a refusal that stays one).

Run: pytest tests/fuzz/test_proxy_header.py (bounded), or
python -m tests.fuzz.soak proxy_header -runs=1000000 (atheris soak, tools/fuzz.sh).
"""

from __future__ import annotations

from typing import Final

from streamq.proxy_protocol import (
    V1_HEADER_BYTES_MAX,
    V1_SIGNATURE,
    V2_BLOCK_BYTES_MAX,
    V2_FIXED_BYTES,
    ProxyHeader,
    ProxyHeaderError,
    parse_header,
)
from tests.fuzz.harness import bounded_run

CORPUS: Final = "proxy"
EXAMPLES: Final = 6000
HEADER_BYTES_MAX: Final = V2_FIXED_BYTES + V2_BLOCK_BYTES_MAX
STEP_BYTES: Final = 7  # prefixes grow by this much: every length would be O(n^2) per input


def parse(data: bytes) -> tuple[ProxyHeader, int] | ProxyHeaderError | None:
    try:
        result = parse_header(data)
    except ProxyHeaderError as exc:
        return exc
    if result is None:
        bound = V1_HEADER_BYTES_MAX if data.startswith(V1_SIGNATURE) else HEADER_BYTES_MAX
        assert len(data) < bound, f"waits for more after {len(data)} bytes"
        return None
    header, used = result
    assert 0 < used <= len(data), (used, len(data))
    assert used <= (V1_HEADER_BYTES_MAX if header.version == 1 else HEADER_BYTES_MAX), used
    return result


def fuzz_one(data: bytes) -> None:
    final = parse(data)
    for size in [*range(0, len(data), STEP_BYTES), len(data) - 1]:
        if size < 0:
            continue
        partial = parse(data[:size])
        if partial is None:
            continue
        if isinstance(partial, ProxyHeaderError):
            assert isinstance(final, ProxyHeaderError), (size, partial, final)
        else:
            assert partial == final, (size, partial, final)
        break


def test_proxy_header_bounded() -> None:
    bounded_run(fuzz_one, CORPUS, EXAMPLES)
