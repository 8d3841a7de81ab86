"""How much of a file the page cache holds, asked of the kernel with mincore(2) (Linux):
for the page cache tests and benchmarks/stream_lag.py."""

from __future__ import annotations

import ctypes
import mmap
import os

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.argtypes = (
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
)
_libc.mmap.restype = ctypes.c_void_p
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)


def resident_fraction(path: str) -> float:
    """The fraction of the file's pages that are in the page cache."""
    size = os.path.getsize(path)
    if size == 0:
        return 0.0
    pages = -(-size // mmap.PAGESIZE)
    fd = os.open(path, os.O_RDONLY)
    try:
        address = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert address not in (None, ctypes.c_void_p(-1).value), "mmap failed"
        try:
            vector = ctypes.create_string_buffer(pages)
            assert _libc.mincore(address, size, vector) == 0, os.strerror(ctypes.get_errno())
        finally:
            _libc.munmap(address, size)
    finally:
        os.close(fd)
    return sum(byte & 1 for byte in vector.raw[:pages]) / pages
