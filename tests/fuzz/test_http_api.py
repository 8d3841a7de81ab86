"""Fuzz the management API (http_gateway): JSON bodies of every PUT and POST, query
strings of the listings (pagination, sort, columns, filters) and of the other reads,
and path segments, over real HTTP (aiohttp's in-process test server and client on
loopback) against a real broker (tests/fuzz/broker_host.py), authenticated as guest.

An input is `request | mode | bytes`. `request` picks one of REQUESTS (method, path,
query, body: RabbitMQ's shapes, as the capture in tests/fuzz/capture.py sent them);
`mode` (mod 4) says what the bytes become: 0 the raw body; 1 edits of the request's
JSON body (tests/fuzz/json_shapes.py); 2 the query string (raw, percent-encoded where
HTTP needs it); 3 the request's last path segment.

The property: no 500 (the API's last-resort handler answers an unexpected exception
with 500 and logs it), nothing logged with a traceback, and every error answer is JSON
with `error` and `reason`, as RabbitMQ's.

Run: pytest tests/fuzz/test_http_api.py (bounded), or
python -m tests.fuzz.soak http_api -runs=1000000 (atheris soak, tools/fuzz.sh).
"""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.parse
from typing import Final

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from amqp_gateway.gateway import Gateway
from http_gateway.server import build_app
from streamq.broker.broker import Broker
from tests.fuzz.broker_host import BrokerHost
from tests.fuzz.harness import bounded_run
from tests.fuzz.json_shapes import JSON, edited

CORPUS: Final = "http"
EXAMPLES: Final = 1600
INPUTS_PER_BROKER: Final = 3000
MODES: Final = 4
AUTHORIZATION: Final = "Basic " + base64.b64encode(b"guest:guest").decode()
_SAFE: Final = "&=,;:/%+"  # left as they are in a fuzzed query string

Request = tuple[str, str, str, JSON]
_DEFINITIONS: Final[JSON] = {
    "vhosts": [{"name": "fv"}],
    "users": [{"name": "fu", "password_hash": "", "tags": "management"}],
    "permissions": [{"user": "fu", "vhost": "fv", "configure": ".*", "write": "", "read": ".*"}],
    "queues": [{"name": "fq", "vhost": "fv", "durable": True, "arguments": {}}],
    "exchanges": [{"name": "fx", "vhost": "fv", "type": "fanout", "durable": True}],
    "bindings": [
        {
            "source": "fx",
            "vhost": "fv",
            "destination": "fq",
            "destination_type": "queue",
            "routing_key": "",
            "arguments": {},
        }
    ],
    "policies": [{"name": "fp", "vhost": "fv", "pattern": "^f", "definition": {"max-length": 9}}],
}
REQUESTS: Final[list[Request]] = [
    ("PUT", "/api/queues/%2F/hq", "", {"durable": True, "arguments": {"x-max-length": 5}}),
    (
        "PUT",
        "/api/queues/%2F/hs",
        "",
        {"durable": True, "arguments": {"x-queue-type": "stream", "x-max-age": "1D"}},
    ),
    ("PUT", "/api/exchanges/%2F/hx", "", {"type": "topic", "durable": True, "arguments": {}}),
    ("POST", "/api/bindings/%2F/e/hx/q/hq", "", {"routing_key": "a.#", "arguments": {"k": 1}}),
    ("POST", "/api/bindings/%2F/e/amq.direct/e/hx", "", {"routing_key": "k"}),
    ("PUT", "/api/users/hu", "", {"password": "p", "tags": "management,policymaker"}),
    ("PUT", "/api/permissions/%2F/hu", "", {"configure": ".*", "write": ".*", "read": "^h"}),
    ("PUT", "/api/vhosts/hv", "", {"description": "d", "tags": "a,b"}),
    (
        "PUT",
        "/api/policies/%2F/hp",
        "",
        {"pattern": "^h", "apply-to": "queues", "definition": {"max-length": 9}, "priority": 1},
    ),
    ("PUT", "/api/operator-policies/%2F/ho", "", {"pattern": ".*", "definition": {"expires": 9}}),
    (
        "PUT",
        "/api/parameters/shovel/%2F/hs",
        "",
        {"value": {"src-uri": "amqp://", "src-queue": "hq", "dest-uri": "amqp://"}},
    ),
    ("PUT", "/api/parameters/federation-upstream/%2F/hf", "", {"value": {"uri": "amqp://"}}),
    # Limits of the import's vhost and user, not of "/": a fuzzed value (0) takes effect,
    # and later inputs and tests use "/".
    ("PUT", "/api/vhost-limits/fv/max-queues", "", {"value": 100}),
    ("PUT", "/api/user-limits/fu/max-channels", "", {"value": 100}),
    ("POST", "/api/definitions", "", _DEFINITIONS),
    ("POST", "/api/definitions/%2F", "", {"queues": [{"name": "dq", "durable": False}]}),
    (
        "POST",
        "/api/exchanges/%2F/amq.default/publish",
        "",
        {
            "properties": {"delivery_mode": 2, "headers": {"a": 1}},
            "routing_key": "hq",
            "payload": "aGk=",
            "payload_encoding": "base64",
        },
    ),
    (
        "POST",
        "/api/queues/%2F/hq/get",
        "",
        {"count": 2, "ackmode": "ack_requeue_true", "encoding": "auto", "truncate": 50},
    ),
    ("POST", "/api/users/bulk-delete", "", {"users": ["nobody"]}),
    ("GET", "/api/queues", "page=1&page_size=10&name=h&use_regex=true&sort=name", None),
    ("GET", "/api/queues/%2F", "sort=messages&sort_reverse=true&columns=name,messages", None),
    ("GET", "/api/exchanges", "page=2&page_size=1&pagination=true&columns=name,type", None),
    ("GET", "/api/bindings", "columns=source,destination&sort=routing_key", None),
    ("GET", "/api/connections", "page=1&page_size=5&name=x", None),
    ("GET", "/api/channels", "sort=name&sort_reverse=false", None),
    ("GET", "/api/consumers/%2F", "columns=consumer_tag", None),
    ("GET", "/api/users", "page=1&page_size=100", None),
    ("GET", "/api/vhosts", "columns=name,messages&name=%2F", None),
    ("GET", "/api/policies", "columns=name,pattern", None),
    ("GET", "/api/overview", "columns=object_totals.queues,queue_totals", None),
    ("GET", "/api/queues/%2F/hq", "lengths_age=60&lengths_incr=5&msg_rates_age=60", None),
    ("GET", "/api/stream-files/%2F/hs", "", None),
    ("GET", "/api/stream-files/%2F/hs/00000000000000000000.segment", "position=0&length=64", None),
    ("GET", "/metrics/detailed", "family=queue_coarse_metrics&vhost=%2F", None),
    ("GET", "/api/definitions", "", None),
    ("GET", "/api/aliveness-test/%2F", "", None),
    ("DELETE", "/api/queues/%2F/hq", "if-unused=true&if-empty=true", None),
    ("DELETE", "/api/exchanges/%2F/hx", "if-unused=true", None),
    ("DELETE", "/api/queues/%2F/hq/contents", "", None),
]


class Api:
    """The broker host and an HTTP client of its management API (renewed with it)."""

    def __init__(self) -> None:
        self.host = BrokerHost(INPUTS_PER_BROKER)
        self.client = self.host.run(self._client(self.host.broker))
        self.host.on_new_broker.append(self._replace)
        for request in REQUESTS:  # what the requests name exists, so they get further
            if request[0] in ("PUT", "POST"):
                self.send(request[0], request[1], request[2], json.dumps(request[3]).encode())

    async def _client(self, broker: Broker) -> TestClient[web.Request, web.Application]:
        # The AMQP gateway as the broker runs it: the API publishes through its codec.
        self.gateway = Gateway(broker)
        self.gateway.attach(asyncio.get_running_loop())
        client: TestClient[web.Request, web.Application] = TestClient(TestServer(build_app(broker)))
        await client.start_server()
        return client

    def _replace(self, broker: Broker) -> None:
        self.gateway.stop()
        self.host.run(self.client.close())
        self.client = self.host.run(self._client(broker))

    def send(self, method: str, path: str, query: str, body: bytes) -> tuple[int, bytes]:
        async def request() -> tuple[int, bytes]:
            url = path + ("?" + query if query else "")
            headers = {"Authorization": AUTHORIZATION, "Content-Type": "application/json"}
            async with self.client.request(
                method, url, data=body or None, headers=headers, allow_redirects=False
            ) as response:
                return response.status, await response.read()

        return self.host.run(request())


_api: Api | None = None


def api() -> Api:
    global _api  # noqa: PLW0603 - one broker for the whole run, opened on first use
    if _api is None:
        _api = Api()
    return _api


def shaped(data: bytes) -> tuple[str, str, str, bytes]:
    """The request an input spells (module docstring)."""
    method, path, query, body = REQUESTS[data[0] % len(REQUESTS)]
    mode, rest = data[1] % MODES, data[2:]
    raw_body = b"" if body is None else json.dumps(body).encode()
    if mode == 0:
        return method, path, query, rest
    if mode == 1:
        return method, path, query, json.dumps(edited(rest, [body])).encode()
    text = urllib.parse.quote(rest.decode("latin-1"), safe=_SAFE)
    if mode == 2:
        return method, path, text, raw_body
    head, _, _last = path.rpartition("/")
    return method, f"{head}/{text.replace('/', '%2F') or 'x'}", query, raw_body


def fuzz_one(data: bytes) -> None:
    if len(data) < 2:
        return
    method, path, query, body = shaped(data)
    fuzzed = api()
    fuzzed.host.next_input()
    status, answer = fuzzed.send(method, path, query, body)
    assert status != 500, (method, path, query, body, answer)
    assert not fuzzed.host.logged_errors(), (method, path, query, body)
    if status >= 400 and answer and not path.startswith("/metrics"):
        error = json.loads(answer)
        assert "error" in error and "reason" in error, error


def test_http_api_bounded() -> None:
    bounded_run(fuzz_one, CORPUS, EXAMPLES)


def test_every_request_template_is_served() -> None:
    fuzzed = api()
    for method, path, query, body in REQUESTS:
        status, answer = fuzzed.send(
            method, path, query, json.dumps(body).encode() if body else b""
        )
        assert status < 500, (method, path, status, answer)


def test_a_lone_surrogate_in_a_redeclared_queue_argument_is_a_400() -> None:
    """Regression of a fuzz finding (docs/fuzzing.md): this answered 500."""
    fuzzed = api()
    assert fuzzed.send("PUT", "/api/queues/%2F/lq", "", b'{"arguments": {"x-max-length": 5}}')[
        0
    ] in (201, 204)
    status, answer = fuzzed.send(
        "PUT", "/api/queues/%2F/lq", "", b'{"arguments": {"x-max-length": "\\ud800"}}'
    )
    assert (status, json.loads(answer)["error"]) == (400, "bad_request"), answer
    assert b"lone surrogate" in answer


def test_a_base64_payload_outside_ascii_is_a_400() -> None:
    """Regression of a fuzz finding (docs/fuzzing.md, the fifth session): a publish whose
    base64 payload holds a character outside ASCII answered 500 (b64decode raises a
    ValueError there, not binascii.Error)."""
    status, answer = api().send(
        "POST",
        "/api/exchanges/%2F/amq.default/publish",
        "",
        b'{"properties": {}, "routing_key": "hq", "payload": "\\u00e9", '
        b'"payload_encoding": "base64"}',
    )
    assert (status, json.loads(answer)["reason"]) == (400, "payload is not valid base64"), answer


def test_an_ackmode_that_is_not_a_string_is_a_400() -> None:
    """Regression of a fuzz finding (docs/fuzzing.md): a JSON object as `ackmode`
    answered 500 (unhashable in the set of modes). Its own queue: the fuzzed requests
    and the templates (which delete `hq` when it is empty) leave `hq` or not."""
    fuzzed = api()
    # The queue first: the shared broker's state is what earlier inputs left (one may
    # have deleted `hq`, and a get from a missing queue is a 404 before the body is read).
    status, answer = fuzzed.send("PUT", "/api/queues/%2F/ackmode-q", "", b'{"durable": true}')
    assert status in (201, 204), answer
    status, answer = fuzzed.send(
        "POST", "/api/queues/%2F/ackmode-q/get", "", b'{"count": 1, "ackmode": {"a": 1}}'
    )
    assert (status, json.loads(answer)["error"]) == (400, "bad_request"), answer
    assert b"ackmode must be one of" in answer
