"""Where a stream's log files are read from: the local disk or the broker's HTTP port.

Owns file access for `logdir`: listing a stream's files with their sizes, reading a small
file whole (`durable`, an index) and positional reads of a segment. `LocalStore` reads the
broker's data directory; `HttpStore` asks the broker's `/api/stream-files` endpoint
(`http_gateway/segments_api.py`) for the same bytes, for executors that do not share the
broker's disk. Both are plain picklable values: they open nothing until asked.

Rules:
1. A file that is gone raises FileNotFoundError (a listing: the stream is gone).
2. Every HTTP request has a timeout; HTTP errors other than 404 raise OSError.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.client
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final, Protocol

HTTP_TIMEOUT_S: Final = 30.0
SMALL_FILE_BYTES_MAX: Final = 64 * 1024 * 1024  # an index of a 3 GiB segment is < 13 MiB


def stream_directory(path: str, vhost: str, stream: str) -> str:
    """`<data dir>/vhosts/<sha1(vhost)>/streams/<sha1(stream)>`, as the broker names them."""
    vhost_digest = hashlib.sha1(vhost.encode()).hexdigest()
    stream_digest = hashlib.sha1(stream.encode("utf-8", "surrogateescape")).hexdigest()
    return os.path.join(path, "vhosts", vhost_digest, "streams", stream_digest)


class SegmentFile(Protocol):
    """An open segment: positional reads, then close; `read_bytes` is how much a reader
    should read at once (a window: `chunkdir._Window`)."""

    read_bytes: int

    def pread(self, length: int, position: int) -> bytes: ...

    def pread_into(self, buffer: memoryview, position: int) -> int:
        """Read into `buffer` from `position`; the bytes read (fewer at the end)."""
        ...

    def size(self) -> int: ...

    def close(self) -> None: ...


class Store(Protocol):
    """The files of one stream's log directory."""

    def describe(self) -> str: ...

    def list_files(self) -> dict[str, int]: ...

    def read_file(self, name: str) -> bytes: ...

    def open_file(self, name: str) -> SegmentFile: ...


class _LocalFile:
    # A window that stays in the CPU's cache: 1M x 1 KiB decoded in 0.54-0.58 CPU-s with
    # 1 MiB reads, 0.59-0.65 with 4 MiB.
    read_bytes = 1 << 20

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_RDONLY)

    def pread(self, length: int, position: int) -> bytes:
        return os.pread(self._fd, length, position)

    def pread_into(self, buffer: memoryview, position: int) -> int:
        # Into memory already touched: a fresh bytes object of a chunk's size per read
        # ran at 0.9 GB/s here (its pages faulted in each time), a reused one at 7 GB/s.
        done = 0
        while done < len(buffer):
            got = os.preadv(self._fd, [buffer[done:]], position + done)
            if got == 0:
                break
            done += got
        return done

    def size(self) -> int:
        return os.fstat(self._fd).st_size

    def close(self) -> None:
        os.close(self._fd)


@dataclass(frozen=True, slots=True)
class LocalStore:
    """A stream's directory on this machine. An open segment stays readable after
    retention unlinks it (Unix semantics)."""

    directory: str

    @classmethod
    def of(cls, path: str, vhost: str, stream: str) -> LocalStore:
        return cls(stream_directory(path, vhost, stream))

    def describe(self) -> str:
        return self.directory

    def list_files(self) -> dict[str, int]:
        sizes = {}
        for entry in os.scandir(self.directory):
            try:
                sizes[entry.name] = entry.stat().st_size
            except FileNotFoundError:
                continue  # deleted by retention while listing
        return sizes

    def read_file(self, name: str) -> bytes:
        with open(os.path.join(self.directory, name), "rb") as f:
            return f.read(SMALL_FILE_BYTES_MAX)

    def open_file(self, name: str) -> SegmentFile:
        return _LocalFile(os.path.join(self.directory, name))


class _HttpFile:
    read_bytes = 4 << 20  # a request each: 1 GB of 1 KiB chunks in 258 requests

    def __init__(self, store: HttpStore, name: str) -> None:
        self._store = store
        self._name = name
        self._size = store.list_files().get(name)
        if self._size is None:
            raise FileNotFoundError(f"{store.describe()}/{name}")

    def pread(self, length: int, position: int) -> bytes:
        return self._store.get(self._name, position, length)

    def pread_into(self, buffer: memoryview, position: int) -> int:
        return self._store.get_into(self._name, position, buffer)

    def size(self) -> int:
        assert self._size is not None
        return self._size

    def close(self) -> None:
        """Nothing is held open between requests."""


@dataclass(frozen=True, slots=True)
class HttpStore:
    """A stream's files served by the broker at `url` (http://host:port), with HTTP basic
    authentication as one of the broker's users."""

    url: str
    vhost: str
    stream: str
    username: str
    password: str

    def describe(self) -> str:
        return f"{self.url} vhost {self.vhost!r} stream {self.stream!r}"

    def _path(self, *parts: str) -> str:
        quoted = [urllib.parse.quote(p, safe="") for p in ("api", "stream-files", *parts)]
        return self.url.rstrip("/") + "/" + "/".join(quoted)

    @contextlib.contextmanager
    def _response(self, target: str) -> Iterator[http.client.HTTPResponse]:
        """The response to a GET of `target`: FileNotFoundError for 404, OSError for
        another HTTP error."""
        credentials = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        request = urllib.request.Request(target, headers={"Authorization": f"Basic {credentials}"})
        try:
            response = urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                raise FileNotFoundError(f"{target}: {exc.read()[:200]!r}") from exc
            raise OSError(f"{target}: HTTP {exc.code} {exc.read()[:200]!r}") from exc
        with response:
            yield response

    def _fetch(self, target: str) -> bytes:
        with self._response(target) as response:
            return bytes(response.read())

    def list_files(self) -> dict[str, int]:
        listing = json.loads(self._fetch(self._path(self.vhost, self.stream)))
        return {str(name): int(size) for name, size in listing["files"].items()}

    def get(self, name: str, position: int, length: int) -> bytes:
        return self._fetch(self._range(name, position, length))

    def get_into(self, name: str, position: int, into: memoryview) -> int:
        """`get` into `into` (no bytes object of the range's size): the bytes read."""
        done = 0
        with self._response(self._range(name, position, len(into))) as response:
            while done < len(into) and (got := response.readinto(into[done:])):
                done += got
        return done

    def _range(self, name: str, position: int, length: int) -> str:
        query = urllib.parse.urlencode({"position": position, "length": length})
        return self._path(self.vhost, self.stream, name) + "?" + query

    def read_file(self, name: str) -> bytes:
        return self.get(name, 0, SMALL_FILE_BYTES_MAX)

    def open_file(self, name: str) -> SegmentFile:
        return _HttpFile(self, name)
