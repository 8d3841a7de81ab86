"""The etcd client of clustering: etcd's v3 JSON gateway (`/v3/kv/*`, `/v3/lease/*`,
`/v3/election/*`, `/v3/watch`) over aiohttp.

Why the gateway and not gRPC: it is the API LavinMQ's own client uses, every etcd 3.4+
serves it on the client port, and aiohttp is already ours, so clustering adds no
dependency (no grpcio and generated stubs to keep in step with etcd's protobufs). In the
gateway's JSON keys and values are base64 and int64 fields are strings; fields equal to
their protobuf default are left out (a missing `TTL` is 0, a missing `succeeded` false).

Rules: every request is bounded by `timeout_s` (split over the endpoints still to try, the
one that answered last tried first); a connection error, a timeout or etcd saying it is
unavailable moves on to the next endpoint, and EtcdUnavailable says none answered. Only
`campaign()` and `watch()` are long requests with no overall bound (they wait for other
nodes by design); both can be cancelled, and cancelling a campaign makes etcd withdraw
the candidate's key. Every response read is bounded (`response_bytes_max`).
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

import aiohttp

# A range over the clustering prefix holds a few small keys per node; anything near this
# is not ours to read.
RESPONSE_BYTES_MAX: Final = 16 << 20
# One watch response line: a batch of events on the leader key or the ISR.
WATCH_LINE_BYTES_MAX: Final = 4 << 20
# A watch that cannot reconnect retries this often, for up to timeout_s.
STREAM_RETRY_S: Final = 0.2
# gRPC status codes that mean "ask another member" (the gateway passes them through).
# CANCELLED is what a member shutting down answers ("the client connection is closing").
_GRPC_UNAVAILABLE: Final = frozenset({1, 4, 14})  # CANCELLED, DEADLINE_EXCEEDED, UNAVAILABLE
_LEASE_NOT_FOUND: Final = "requested lease not found"

Json = dict[str, Any]  # the gateway's JSON objects; private to this module


class EtcdError(Exception):
    """etcd refused a request (`code` is its gRPC status code, 0 when not known)."""

    def __init__(self, message: str, code: int = 0) -> None:
        super().__init__(message)
        self.code = code


class EtcdUnavailable(EtcdError):
    """No endpoint answered within the timeout."""


@dataclass(frozen=True, slots=True)
class KeyValue:
    """One key as etcd stores it."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int


def _b64(data: str | bytes) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.b64encode(raw).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text)


def prefix_range_end(prefix: str) -> bytes:
    """The `range_end` covering every key that starts with `prefix` (etcd's
    GetPrefixRangeEnd): the prefix with its last byte below 0xff incremented."""
    end = bytearray(prefix.encode())
    while end and end[-1] == 0xFF:
        end.pop()
    if not end:
        return b"\0"  # every key
    end[-1] += 1
    return bytes(end)


def _key_value(kv: Json) -> KeyValue:
    return KeyValue(
        key=_unb64(kv["key"]).decode(errors="replace"),
        value=_unb64(kv.get("value", "")),
        create_revision=int(kv.get("create_revision", 0)),
        mod_revision=int(kv.get("mod_revision", 0)),
        lease=int(kv.get("lease", 0)),
    )


def _revision(response: Json) -> int:
    return int(response.get("header", {}).get("revision", 0))


def _base_url(endpoint: str) -> str:
    endpoint = endpoint.strip().rstrip("/")
    if not endpoint:
        raise ValueError("an empty etcd endpoint")
    return endpoint if "://" in endpoint else f"http://{endpoint}"


def _error(body: Json) -> EtcdError:
    """The gateway's error object, as {"error", "message", "code"} or, in a stream,
    {"error": {"grpc_code", "message", ...}}."""
    error = body.get("error")
    if isinstance(error, dict):
        body = error
    code_field = body.get("code", body.get("grpc_code"))
    code = int(code_field) if isinstance(code_field, int | str) else 0
    message = str(body.get("message") or body.get("error") or "etcd error")
    if code in _GRPC_UNAVAILABLE:
        return EtcdUnavailable(message, code)
    return EtcdError(message, code)


async def _read_bounded(response: aiohttp.ClientResponse) -> bytes:
    body = bytearray()
    async for chunk in response.content.iter_any():
        body += chunk
        if len(body) > RESPONSE_BYTES_MAX:
            raise EtcdError(f"etcd's answer is over {RESPONSE_BYTES_MAX} bytes")
    return bytes(body)


def _decode(status: int, body: bytes) -> Json:
    try:
        decoded = json.loads(body)
    except ValueError as exc:
        raise EtcdError(f"etcd answered HTTP {status} with no JSON: {body[:200]!r}") from exc
    if not isinstance(decoded, dict):
        raise EtcdError(f"etcd answered HTTP {status} with {body[:200]!r}")
    if status != 200 or "error" in decoded:
        raise _error(decoded)
    return decoded


class Etcd:
    """A client of one etcd cluster through any of `endpoints` ("host:port" or
    "http://host:port"). Create it anywhere; it opens its HTTP session on first use, inside
    the running event loop. `close()` it when done."""

    def __init__(self, endpoints: Sequence[str], *, timeout_s: float = 5.0) -> None:
        self._urls = [_base_url(endpoint) for endpoint in endpoints]
        if not self._urls:
            raise ValueError("no etcd endpoint given")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, not {timeout_s}")
        self.timeout_s = timeout_s
        self._preferred = 0  # the endpoint that answered last
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # No total timeout here: each request sets its own (campaign and watch wait on
            # purpose); connecting is always bounded.
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.timeout_s)
            self._session = aiohttp.ClientSession(timeout=timeout)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _order(self) -> list[int]:
        count = len(self._urls)
        return [(self._preferred + step) % count for step in range(count)]

    async def _call(self, path: str, body: Json) -> Json:
        """POST `body` to `path`, bounded by timeout_s over all endpoints."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        failures: list[str] = []
        order = self._order()
        for tried, index in enumerate(order):
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            try:
                async with asyncio.timeout(remaining / (len(order) - tried)):
                    answer = await self._post(self._urls[index], path, body)
            except (aiohttp.ClientError, OSError, TimeoutError, EtcdUnavailable) as exc:
                failures.append(f"{self._urls[index]}: {exc!r}")
                continue
            self._preferred = index
            return answer
        raise EtcdUnavailable(
            f"no etcd endpoint answered {path} within {self.timeout_s} s: " + "; ".join(failures)
        )

    async def _post(self, url: str, path: str, body: Json) -> Json:
        async with self._client().post(url + path, json=body) as response:
            return _decode(response.status, await _read_bounded(response))

    async def _call_long(self, path: str, body: Json) -> Json:
        """POST with no overall bound (a campaign): tries each endpoint once."""
        failures: list[str] = []
        for index in self._order():
            try:
                answer = await self._post(self._urls[index], path, body)
            except (aiohttp.ClientError, OSError, EtcdUnavailable) as exc:
                failures.append(f"{self._urls[index]}: {exc!r}")
                continue
            self._preferred = index
            return answer
        raise EtcdUnavailable(f"no etcd endpoint answered {path}: " + "; ".join(failures))

    # Leases.

    async def lease_grant(self, ttl_s: int) -> int:
        """A new lease of `ttl_s` seconds; returns its id."""
        answer = await self._call("/v3/lease/grant", {"TTL": str(ttl_s)})
        return int(answer["ID"])

    async def lease_keepalive(self, lease: int) -> int:
        """Renews `lease` once; returns its remaining TTL in seconds, 0 when it is gone."""
        answer = await self._call("/v3/lease/keepalive", {"ID": str(lease)})
        result = answer.get("result", {})
        return int(result.get("TTL", 0))

    async def lease_revoke(self, lease: int) -> None:
        """Ends `lease` and deletes every key bound to it; a lease already gone is fine."""
        try:
            await self._call("/v3/lease/revoke", {"ID": str(lease)})
        except EtcdError as exc:
            if _LEASE_NOT_FOUND not in str(exc) or isinstance(exc, EtcdUnavailable):
                raise

    # Keys.

    async def range(self, key: str, *, prefix: bool = False) -> tuple[list[KeyValue], int]:
        """The key (or every key under the prefix `key`), and the store revision read."""
        body: Json = {"key": _b64(key)}
        if prefix:
            body["range_end"] = _b64(prefix_range_end(key))
        answer = await self._call("/v3/kv/range", body)
        return [_key_value(kv) for kv in answer.get("kvs", [])], _revision(answer)

    async def get(self, key: str) -> bytes | None:
        kvs, _ = await self.range(key)
        return kvs[0].value if kvs else None

    async def get_prefix(self, prefix: str) -> dict[str, bytes]:
        kvs, _ = await self.range(prefix, prefix=True)
        return {kv.key: kv.value for kv in kvs}

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> None:
        """Sets `key`; with `lease`, the key is deleted when the lease ends."""
        body: Json = {"key": _b64(key), "value": _b64(value)}
        if lease:
            body["lease"] = str(lease)
        await self._call("/v3/kv/put", body)

    async def delete(self, key: str) -> None:
        await self._call("/v3/kv/deleterange", {"key": _b64(key)})

    async def put_if_absent(self, key: str, value: bytes) -> bytes:
        """Sets `key` to `value` unless it exists (one transaction); returns what is stored
        now: `value`, or the value another writer put first."""
        answer = await self._call(
            "/v3/kv/txn",
            {
                "compare": [_created(key, "EQUAL")],
                "success": [{"request_put": {"key": _b64(key), "value": _b64(value)}}],
                "failure": [{"request_range": {"key": _b64(key)}}],
            },
        )
        if answer.get("succeeded"):
            return value
        kvs = answer["responses"][0]["response_range"].get("kvs", [])
        if not kvs:  # deleted between the compare and the range: cannot happen in one txn
            raise EtcdError(f"{key} vanished inside a transaction")
        return _key_value(kvs[0]).value

    async def put_if_exists(self, guard: str, key: str, value: bytes) -> bool:
        """Sets `key` only if the key `guard` exists, in one transaction (fencing: `guard`
        is a leader key bound to the leader's lease). False if `guard` is gone."""
        answer = await self._call(
            "/v3/kv/txn",
            {
                "compare": [_created(guard, "GREATER")],
                "success": [{"request_put": {"key": _b64(key), "value": _b64(value)}}],
            },
        )
        return bool(answer.get("succeeded", False))

    # Elections (etcd's election service: candidates' keys under "<election>/", the
    # oldest one is the leader).

    async def campaign(self, election: str, value: bytes, lease: int) -> str:
        """Blocks until this lease's candidate is the leader of `election`; returns the
        leader key. Cancelling it withdraws the candidate."""
        answer = await self._call_long(
            "/v3/election/campaign",
            {"name": _b64(election), "value": _b64(value), "lease": str(lease)},
        )
        return _unb64(answer["leader"]["key"]).decode()

    async def resign(self, election: str, leader_key: str) -> None:
        """Gives up leadership: deletes our leader key (it names our lease, so it can be
        no one else's), and the next candidate is elected."""
        assert leader_key.startswith(election + "/"), (election, leader_key)
        await self.delete(leader_key)

    async def leader_kv(self, election: str) -> tuple[KeyValue | None, int]:
        """The leader's key of `election` (None if there is none), and the revision read:
        the candidate key created first, as etcd's election service defines it."""
        prefix = election + "/"
        answer = await self._call(
            "/v3/kv/range",
            {
                "key": _b64(prefix),
                "range_end": _b64(prefix_range_end(prefix)),
                "limit": "1",
                "sort_order": "ASCEND",
                "sort_target": "CREATE",
            },
        )
        kvs = answer.get("kvs", [])
        return (_key_value(kvs[0]) if kvs else None), _revision(answer)

    async def leader(self, election: str) -> bytes | None:
        kv, _ = await self.leader_kv(election)
        return None if kv is None else kv.value

    # Watches.

    async def watch(
        self, key: str, *, prefix: bool = False, start_revision: int = 0
    ) -> AsyncGenerator[None]:
        """Yields once per batch of changes to `key` (or under the prefix `key`) from
        `start_revision` on (0: from now). Reconnects, without missing a change, when a
        stream breaks; raises EtcdUnavailable if no endpoint takes the watch."""
        create: Json = {"key": _b64(key)}
        if prefix:
            create["range_end"] = _b64(prefix_range_end(key))
        next_revision = start_revision
        while True:
            if next_revision:
                create["start_revision"] = str(next_revision)
            response = await self._open_retrying("/v3/watch", {"create_request": create})
            try:
                async with response:
                    async for line in _lines(response):
                        result = _watch_result(line)
                        if result.canceled:
                            # Compacted below the start revision: a change may have been
                            # missed, so report one and watch again from now.
                            next_revision = 0
                            create.pop("start_revision", None)
                            yield
                            break
                        if result.changed or not next_revision:
                            next_revision = result.revision + 1
                        if result.changed:
                            yield
            except (aiohttp.ClientError, OSError, EtcdUnavailable):
                pass  # the stream broke: reconnect from next_revision

    async def _open_retrying(self, path: str, body: Json) -> aiohttp.ClientResponse:
        """Opens a stream, retrying for up to timeout_s (an etcd restarting, a member
        changing): a watch that broke reconnects without its caller seeing it."""
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        while True:
            try:
                return await self._open_stream(path, body)
            except EtcdUnavailable:
                if asyncio.get_running_loop().time() + STREAM_RETRY_S > deadline:
                    raise
            await asyncio.sleep(STREAM_RETRY_S)

    async def _open_stream(self, path: str, body: Json) -> aiohttp.ClientResponse:
        failures: list[str] = []
        for index in self._order():
            try:
                response = await self._client().post(self._urls[index] + path, json=body)
            except (aiohttp.ClientError, OSError) as exc:
                failures.append(f"{self._urls[index]}: {exc!r}")
                continue
            if response.status != 200:
                answer = await _read_bounded(response)
                response.release()
                _decode(response.status, answer)  # raises etcd's error
                raise EtcdError(f"etcd answered HTTP {response.status} to {path}")
            self._preferred = index
            return response
        raise EtcdUnavailable(f"no etcd endpoint answered {path}: " + "; ".join(failures))


def _created(key: str, result: str) -> Json:
    """A compare on `key`'s create revision against 0 (0: the key does not exist)."""
    return {"key": _b64(key), "target": "CREATE", "result": result, "create_revision": "0"}


@dataclass(frozen=True, slots=True)
class _WatchResult:
    revision: int  # the newest revision this message covers
    changed: bool
    canceled: bool


def _watch_result(line: bytes) -> _WatchResult:
    """One watch stream message: creation, a batch of events, progress, or cancellation."""
    result = _decode(200, line).get("result", {})
    events = result.get("events", [])
    revision = max(
        (int(event["kv"].get("mod_revision", 0)) for event in events),
        default=_revision(result),
    )
    return _WatchResult(revision, bool(events), bool(result.get("canceled")))


async def _lines(response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """The newline-delimited JSON messages of a gateway stream, each bounded."""
    pending = bytearray()
    async for chunk in response.content.iter_any():
        pending += chunk
        while (end := pending.find(b"\n")) >= 0:
            line = bytes(pending[:end]).strip()
            del pending[: end + 1]
            if line:
                yield line
        if len(pending) > WATCH_LINE_BYTES_MAX:
            raise EtcdError(f"an etcd stream message over {WATCH_LINE_BYTES_MAX} bytes")
    if pending.strip():
        yield bytes(pending).strip()
