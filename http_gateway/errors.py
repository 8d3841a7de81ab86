"""The HTTP gateway's error: a status and a reason, rendered as RabbitMQ renders them.

Owns `HttpError` and the JSON error body (`{"error": ..., "reason": ...}`, the shape of
RabbitMQ's management API). Handlers raise it; the server's error middleware renders it.
"""

from __future__ import annotations

from typing import Final

from aiohttp import web

# RabbitMQ's `error` field for the statuses the API answers with.
ERROR_KINDS: Final = {
    400: "bad_request",
    401: "not_authorised",
    403: "not_authorised",
    404: "Object Not Found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    500: "internal_error",
    503: "service_unavailable",
}


class HttpError(Exception):
    """A request answered with `status` and a JSON error body giving `reason`; `kind`
    replaces the status's usual `error` field where RabbitMQ answers otherwise, and a
    reason may be a list of strings where RabbitMQ's is an Erlang tuple
    (`["no_such_user", "u"]`)."""

    def __init__(self, status: int, reason: str | list[str], kind: str | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.kind = kind


def error_response(status: int, reason: str | list[str], kind: str | None = None) -> web.Response:
    kind = kind or ERROR_KINDS.get(status, "error")
    response = web.json_response({"error": kind, "reason": reason}, status=status)
    if status == 401:
        response.headers["WWW-Authenticate"] = 'Basic realm="streamq"'
    return response
