"""The management API client of `streamq ctl`: one HTTP request, its JSON and its errors.

Owns the connection to a running broker's management API (RabbitMQ's paths and JSON, over
the standard library's `http.client`: the command needs no aiohttp), the `--uri` format
(http://user:password@host:port), the request timeout and the translation of every failure
into a `CtlError`: one line for stderr and an exit status. It never prints.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
from dataclasses import dataclass, replace
from typing import Final
from urllib.parse import quote, unquote, urlsplit

DEFAULT_URI: Final = "http://guest:guest@127.0.0.1:15672"
URI_ENV: Final = "STREAMQ_CTL_URI"
DEFAULT_PORT: Final = 15672
TIMEOUT_S_DEFAULT: Final = 10.0
ANSWER_BYTES_MAX: Final = 256 * 1024 * 1024  # a definitions export of a large broker fits

# Exit statuses. 1 and 2 as before the HTTP API; 69 and 77 as rabbitmqctl (sysexits.h),
# so that a script can tell "retry later" and "fix the credentials" from a refused request.
EXIT_OK: Final = 0
EXIT_ERROR: Final = 1  # the broker refused the request (400, 404, 405, 5xx) or a local error
EXIT_USAGE: Final = 2  # bad arguments (argparse's status)
EXIT_UNAVAILABLE: Final = 69  # no broker answers: refused, timed out, not an HTTP server
EXIT_NOPERM: Final = 77  # 401 (login failed, not a management user) or 403 (not allowed)

JsonValue = None | bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"]


class CtlError(Exception):
    """A failure of a command: `str(exc)` is the message, `exit_status` the process's."""

    def __init__(
        self, message: str, exit_status: int = EXIT_ERROR, *, status: int | None = None
    ) -> None:
        super().__init__(message)
        self.exit_status = exit_status
        self.status = status  # the HTTP status, if the broker answered with an error


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where the management API listens and whom to log in as."""

    scheme: str
    host: str
    port: int
    user: str
    password: str

    @classmethod
    def parse(cls, uri: str) -> Endpoint:
        """Raises CtlError (usage) unless `uri` is http(s)://[user:password@]host[:port]."""
        try:
            parts = urlsplit(uri)
            port = parts.port
        except ValueError as exc:
            raise CtlError(f"bad --uri {uri!r}: {exc}", EXIT_USAGE) from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise CtlError(f"--uri must be http://user:password@host:port, got {uri!r}", EXIT_USAGE)
        return cls(
            scheme=parts.scheme,
            host=parts.hostname,
            port=port or DEFAULT_PORT,
            user=unquote(parts.username or "guest"),
            password=unquote(parts.password or "guest"),
        )

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def path(*segments: str) -> str:
    """`/api/<segments>`, each percent-encoded whole: vhost "/" becomes %2F, as RabbitMQ's."""
    return "/api/" + "/".join(quote(segment, safe="") for segment in segments)


class ApiClient:
    """Sends requests to one broker; each opens its own connection, with `timeout_s`."""

    def __init__(self, endpoint: Endpoint, timeout_s: float = TIMEOUT_S_DEFAULT) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s

    def as_user(self, user: str, password: str) -> ApiClient:
        """The same broker, logged in as another user."""
        return ApiClient(replace(self.endpoint, user=user, password=password), self.timeout_s)

    def get(self, api_path: str) -> JsonValue:
        return self.request("GET", api_path)

    def get_list(self, api_path: str) -> list[dict[str, JsonValue]]:
        """GET a listing: a JSON array of objects (or RabbitMQ's paged `{"items": [...]}`)."""
        answer = self.get(api_path)
        if isinstance(answer, dict) and isinstance(answer.get("items"), list):
            answer = answer["items"]
        if not isinstance(answer, list) or not all(isinstance(i, dict) for i in answer):
            raise CtlError(f"unexpected answer to GET {api_path}: not a list of objects")
        return [item for item in answer if isinstance(item, dict)]

    def get_object(self, api_path: str) -> dict[str, JsonValue]:
        answer = self.get(api_path)
        if not isinstance(answer, dict):
            raise CtlError(f"unexpected answer to GET {api_path}: not an object")
        return answer

    def exists(self, api_path: str) -> bool:
        """True if GET answers 200, False if 404; other errors raise."""
        try:
            self.get(api_path)
        except CtlError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def request(
        self,
        method: str,
        api_path: str,
        body: JsonValue = None,
        *,
        headers: dict[str, str] | None = None,
        raw_body: bytes | None = None,
    ) -> JsonValue:
        """Send one request; the decoded JSON answer (None if the body is empty).

        Raises CtlError: EXIT_UNAVAILABLE if no broker answers within `timeout_s`,
        EXIT_NOPERM on 401 and 403, EXIT_ERROR on any other status from 400 on.
        """
        data = raw_body if raw_body is not None else None if body is None else _encode(body)
        status, answer = self._exchange(method, api_path, data, headers or {})
        if status >= 400:
            raise _status_error(status, answer)
        if not answer.strip():
            return None
        try:
            decoded: JsonValue = json.loads(answer)
        except ValueError:
            raise CtlError(f"unexpected answer to {method} {api_path}: not JSON") from None
        return decoded

    def _exchange(
        self, method: str, api_path: str, data: bytes | None, extra: dict[str, str]
    ) -> tuple[int, bytes]:
        endpoint = self.endpoint
        kind = (
            http.client.HTTPSConnection
            if endpoint.scheme == "https"
            else http.client.HTTPConnection
        )
        conn = kind(endpoint.host, endpoint.port, timeout=self.timeout_s)
        token = base64.b64encode(f"{endpoint.user}:{endpoint.password}".encode()).decode()
        headers = {"Authorization": f"Basic {token}", "Accept": "application/json", **extra}
        if data is not None:
            headers["Content-Type"] = "application/json"
        try:
            conn.request(method, api_path, data, headers)
            response = conn.getresponse()
            return response.status, response.read(ANSWER_BYTES_MAX)
        except ConnectionRefusedError:
            raise CtlError(f"no broker answers at {endpoint}", EXIT_UNAVAILABLE) from None
        except TimeoutError:
            raise CtlError(
                f"no answer from {endpoint} within {self.timeout_s:g} s", EXIT_UNAVAILABLE
            ) from None
        except socket.gaierror as exc:
            raise CtlError(
                f"cannot resolve {endpoint.host}: {exc.strerror}", EXIT_UNAVAILABLE
            ) from None
        except (OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            raise CtlError(
                f"no management API answers at {endpoint}: {reason}", EXIT_UNAVAILABLE
            ) from None
        finally:
            conn.close()


def _encode(body: JsonValue) -> bytes:
    return json.dumps(body, ensure_ascii=False).encode()


def _status_error(status: int, answer: bytes) -> CtlError:
    """`<status>: <reason>`, the reason from RabbitMQ's `{"error": .., "reason": ..}` body."""
    try:
        decoded = json.loads(answer)
    except ValueError:
        decoded = None
    if isinstance(decoded, dict) and isinstance(decoded.get("reason"), str):
        reason = str(decoded["reason"])
    else:
        reason = answer.decode(errors="replace").strip() or http.client.responses.get(status, "")
    exit_status = EXIT_NOPERM if status in (401, 403) else EXIT_ERROR
    return CtlError(f"{status}: {reason}", exit_status, status=status)
