"""`streamq ctl set_policy | clear_policy | list_policies`: policies of a running broker.

Owns the policy subcommands of `streamq ctl`, which, unlike the account subcommands, talk
to a running broker through its management API (`PUT /api/policies/{vhost}/{name}` and
the rest), as lavinmqctl does: a policy takes effect on live queues at once. The broker's
address and credentials come from `--uri` (http://guest:guest@127.0.0.1:15672).
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import sys
from typing import Final
from urllib.parse import quote, urlsplit

DEFAULT_URI: Final = "http://guest:guest@127.0.0.1:15672"
TIMEOUT_S: Final = 10
EXIT_ERROR: Final = 1
COLUMNS: Final = ("vhost", "name", "pattern", "apply-to", "definition", "priority")


class PolicyCtlError(Exception):
    """Reported as one line on stderr with exit status 1."""


def add_subcommands(subcommands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    def common(name: str, text: str) -> argparse.ArgumentParser:
        sub = subcommands.add_parser(name, help=text, description=text)
        sub.add_argument("--uri", default=DEFAULT_URI, help=f"management API ({DEFAULT_URI})")
        sub.add_argument("-p", "--vhost", default="/", help="vhost (/)")
        sub.set_defaults(ctl_online=name)
        return sub

    setter = common("set_policy", "set a policy on a running broker")
    setter.add_argument("name")
    setter.add_argument("pattern", help="a regular expression matched in queue/exchange names")
    setter.add_argument("definition", help='JSON, e.g. \'{"max-age": "7D"}\'')
    setter.add_argument("--priority", type=int, default=0)
    setter.add_argument(
        "--apply-to",
        default="all",
        choices=("all", "queues", "exchanges", "classic_queues", "streams"),
    )
    common("clear_policy", "remove a policy from a running broker").add_argument("name")
    lister = common("list_policies", "list the policies of a vhost of a running broker")
    lister.add_argument("--json", action="store_true", help="print JSON, not a table")


def main(args: argparse.Namespace) -> int:
    try:
        _run(args)
    except (PolicyCtlError, OSError) as exc:
        print(f"streamq ctl: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_ERROR
    return 0


def _run(args: argparse.Namespace) -> None:
    path = f"/api/policies/{quote(args.vhost, safe='')}"
    if args.ctl_online == "set_policy":
        try:
            definition = json.loads(args.definition)
        except ValueError as exc:
            raise PolicyCtlError(f"the definition is not JSON: {exc}") from None
        body = {
            "pattern": args.pattern,
            "definition": definition,
            "priority": args.priority,
            "apply-to": args.apply_to,
        }
        _call(args.uri, "PUT", f"{path}/{quote(args.name, safe='')}", body)
    elif args.ctl_online == "clear_policy":
        _call(args.uri, "DELETE", f"{path}/{quote(args.name, safe='')}", None)
    else:
        policies = _call(args.uri, "GET", path, None)
        if not isinstance(policies, list):
            raise PolicyCtlError("unexpected answer from the broker")
        if args.json:
            print(json.dumps(policies, indent=2))
            return
        print("\t".join(COLUMNS))
        for policy in policies:
            print("\t".join(_cell(policy.get(column)) for column in COLUMNS))


def _cell(value: object) -> str:
    return json.dumps(value) if isinstance(value, dict) else str(value)


def _call(uri: str, method: str, path: str, body: object) -> object:
    parts = urlsplit(uri)
    if parts.scheme != "http" or not parts.hostname:
        raise PolicyCtlError(f"--uri must be http://user:password@host:port, got {uri!r}")
    token = base64.b64encode(f"{parts.username or ''}:{parts.password or ''}".encode())
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 15672, timeout=TIMEOUT_S)
    try:
        conn.request(
            method,
            path,
            None if body is None else json.dumps(body),
            {"Authorization": f"Basic {token.decode()}", "Content-Type": "application/json"},
        )
        response = conn.getresponse()
        data = response.read()
    except ConnectionRefusedError:
        raise PolicyCtlError(f"no broker answers at {parts.hostname}:{parts.port}") from None
    finally:
        conn.close()
    answer = json.loads(data) if data else None
    if response.status >= 400:
        reason = answer.get("reason") if isinstance(answer, dict) else data.decode(errors="replace")
        raise PolicyCtlError(f"{response.status}: {reason}")
    return answer
