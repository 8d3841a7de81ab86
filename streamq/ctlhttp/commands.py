"""The verbs of `streamq ctl`, their arguments and how one runs against the HTTP API.

Owns the command surface modelled on lavinmqctl and rabbitmqctl: the table of verbs (name,
help, positionals, flags, handler), the global flags every verb takes before or after its
name (`--uri`, `-p/--vhost`, `--format`, `--json`, `--timeout`, `--data-dir`) and `run`,
which sends one verb to a running broker and prints its result. `streamq.ctl` adds the
offline forms (`--data-dir`) and dispatches between the two.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from streamq.argtypes import non_negative_int
from streamq.ctlhttp import accounts, backup, entities, limits, links, node
from streamq.ctlhttp.client import (
    DEFAULT_URI,
    EXIT_ERROR,
    EXIT_UNAVAILABLE,
    TIMEOUT_S_DEFAULT,
    URI_ENV,
    ApiClient,
    CtlError,
    Endpoint,
)
from streamq.ctlhttp.output import FORMATS, Result, render

DEFAULT_VHOST: Final = "/"
LOCAL_VERBS: Final = frozenset({"hash_password"})  # need neither a broker nor a data dir
Handler = Callable[[ApiClient, argparse.Namespace], Result]
Options = Callable[[argparse.ArgumentParser], None]


@dataclass(frozen=True, slots=True)
class Verb:
    name: str
    help: str
    handler: Handler
    positionals: tuple[str, ...] = ()  # "x..." takes any number, "x?" is optional
    options: Options | None = None


_count = non_negative_int("a whole number")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text}")
    return value


def add_global_flags(parser: argparse.ArgumentParser, *, on_verb: bool) -> None:
    """The flags of `streamq ctl` itself; repeated on each verb with SUPPRESS defaults so
    that they may come after the verb without resetting what came before it."""

    def default(value: object) -> object:
        return argparse.SUPPRESS if on_verb else value

    parser.add_argument(
        "-U",
        "--uri",
        default=default(None),
        help=f"management API of the broker (${URI_ENV} or {DEFAULT_URI})",
    )
    parser.add_argument("-p", "--vhost", default=default(None), help="vhost (/)")
    parser.add_argument(
        "-f",
        "--format",
        dest="output_format",
        choices=FORMATS,
        default=default("table"),
        help="aligned table for people, or JSON for scripts (table)",
    )
    parser.add_argument(
        "--json",
        dest="output_format",
        action="store_const",
        const="json",
        default=argparse.SUPPRESS,
        help="same as --format json",
    )
    parser.add_argument(
        "--timeout",
        type=_seconds,
        metavar="S",
        dest="timeout_s",
        default=default(TIMEOUT_S_DEFAULT),
        help=f"seconds to wait for each answer ({TIMEOUT_S_DEFAULT:g})",
    )
    parser.add_argument(
        "--data-dir",
        default=default(None),
        metavar="DIR",
        help="edit the users, vhosts and permissions of a stopped broker's data directory "
        "(or back it up) instead of calling a running broker",
    )


def add_verbs(subcommands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for verb in VERBS:
        sub = subcommands.add_parser(verb.name, help=verb.help, description=verb.help)
        add_global_flags(sub, on_verb=True)
        for positional in verb.positionals:
            name = positional.rstrip(".?")
            nargs = "*" if positional.endswith("...") else "?" if positional.endswith("?") else None
            sub.add_argument(name, nargs=nargs, metavar=name.upper())
        if verb.options is not None:
            verb.options(sub)
        sub.set_defaults(ctl_handler=verb.handler)


def resolve_vhost(args: argparse.Namespace) -> None:
    """`args.vhost` is "/" unless -p was given; `args.vhost_given` says whether it was (some
    verbs act on the whole node without it)."""
    args.vhost_given = args.vhost is not None
    if args.vhost is None:
        args.vhost = DEFAULT_VHOST


def run(args: argparse.Namespace, *, unavailable_hint: str = "") -> int:
    """Run the parsed verb against the broker at --uri; returns the exit status.

    `unavailable_hint` is added to the error when no broker answers."""
    try:
        endpoint = Endpoint.parse(args.uri or os.environ.get(URI_ENV) or DEFAULT_URI)
        handler: Handler = args.ctl_handler
        result = handler(ApiClient(endpoint, args.timeout_s), args)
    except CtlError as exc:
        if exc.exit_status == EXIT_UNAVAILABLE and unavailable_hint:
            exc = CtlError(f"{exc} {unavailable_hint}", exc.exit_status)
        return report(exc)
    return emit(render(result, args.output_format))


def emit(text: str) -> int:
    """Print a result; 0, or 1 if stdout was closed early (`streamq ctl ... | head -1`)."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # As the Python docs advise: no second error when the interpreter flushes at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_ERROR
    return 0


def report(exc: CtlError) -> int:
    """Print the error as one line on stderr; its exit status."""
    print(f"streamq ctl: {' '.join(str(exc).split())}", file=sys.stderr)
    return exc.exit_status


# Verb-specific flags.


def _set_policy_options(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--priority", type=int, default=0, help="higher wins (0)")
    sub.add_argument("--apply-to", default="all", choices=entities.APPLY_TO, help="(all)")


def _create_queue_options(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--durable", action="store_true", help="survives a restart")
    sub.add_argument("--auto-delete", action="store_true", help="deleted after its last consumer")
    for flag, metavar, text in (
        ("--expires", "MS", "delete the queue after MS unused (x-expires)"),
        ("--max-length", "N", "keep at most N messages (x-max-length)"),
        ("--message-ttl", "MS", "expire messages after MS (x-message-ttl)"),
        ("--delivery-limit", "N", "dead-letter after N redeliveries (x-delivery-limit)"),
    ):
        sub.add_argument(flag, type=_count, metavar=metavar, help=text)
    sub.add_argument(
        "--reject-on-overflow",
        action="store_true",
        help="over max-length, refuse publishes instead of dropping the oldest",
    )
    sub.add_argument("--dead-letter-exchange", metavar="EXCHANGE", help="x-dead-letter-exchange")
    sub.add_argument("--dead-letter-routing-key", metavar="KEY", help="x-dead-letter-routing-key")
    sub.add_argument("--stream-queue", action="store_true", help="a stream (implies --durable)")


def _create_exchange_options(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--durable", action="store_true", help="survives a restart")
    sub.add_argument("--auto-delete", action="store_true", help="deleted after its last binding")
    sub.add_argument("--internal", action="store_true", help="no publishing to it directly")
    sub.add_argument(
        "--delayed", action="store_true", help="an x-delayed-message exchange routing as TYPE"
    )
    sub.add_argument("--alternate-exchange", metavar="EXCHANGE", help="where unroutable go")


def _delete_queue_options(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--if-unused", action="store_true", help="only if it has no consumers")
    sub.add_argument("--if-empty", action="store_true", help="only if it has no messages")


def _delete_exchange_options(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--if-unused", action="store_true", help="only if it has no bindings")


VERBS: Final = (
    # Users.
    Verb(
        "add_user", "add a user (no tags, no permissions)", accounts.add_user, ("name", "password")
    ),
    Verb("delete_user", "delete a user and its permissions", accounts.delete_user, ("name",)),
    Verb("list_users", "list users and their tags", accounts.list_users),
    Verb("change_password", "change a password", accounts.change_password, ("name", "password")),
    Verb("clear_password", "clear a password: logins fail", accounts.clear_password, ("name",)),
    Verb("set_user_tags", "replace a user's tags", accounts.set_user_tags, ("name", "tags...")),
    Verb("authenticate_user", "check a password", accounts.authenticate_user, ("name", "password")),
    Verb(
        "hash_password",
        "print a password's hash for definitions files (no broker needed)",
        accounts.hash_password,
        ("password",),
    ),
    # Vhosts.
    Verb("add_vhost", "add a vhost", accounts.add_vhost, ("name",)),
    Verb("delete_vhost", "delete a vhost and everything in it", accounts.delete_vhost, ("name",)),
    Verb("list_vhosts", "list vhosts", accounts.list_vhosts),
    # Permissions.
    Verb(
        "set_permissions",
        "set a user's configure, write and read regexes in a vhost",
        accounts.set_permissions,
        ("user", "configure", "write", "read"),
    ),
    Verb(
        "clear_permissions",
        "remove a user's permissions in a vhost",
        accounts.clear_permissions,
        ("user",),
    ),
    Verb("list_permissions", "list the permissions in a vhost", accounts.list_permissions),
    Verb(
        "list_user_permissions",
        "list a user's permissions",
        accounts.list_user_permissions,
        ("user",),
    ),
    # Topic permissions.
    Verb(
        "set_topic_permissions",
        "set a user's write and read routing key regexes on a topic exchange of a vhost",
        accounts.set_topic_permissions,
        ("user", "exchange", "write", "read"),
    ),
    Verb(
        "clear_topic_permissions",
        "remove a user's topic permissions in a vhost (on one exchange if given)",
        accounts.clear_topic_permissions,
        ("user", "exchange?"),
    ),
    Verb(
        "list_topic_permissions",
        "list the topic permissions in a vhost",
        accounts.list_topic_permissions,
    ),
    Verb(
        "list_user_topic_permissions",
        "list a user's topic permissions",
        accounts.list_user_topic_permissions,
        ("user",),
    ),
    # Limits.
    Verb(
        "set_vhost_limits",
        "set a vhost's limits, a JSON object: max-connections, max-queues (replaces them all)",
        limits.set_vhost_limits,
        ("definition",),
    ),
    Verb("clear_vhost_limits", "remove a vhost's limits", limits.clear_vhost_limits),
    Verb(
        "list_vhost_limits",
        "list a vhost's limits (--global: every vhost's)",
        limits.list_vhost_limits,
        (),
        limits.list_vhost_limits_options,
    ),
    Verb(
        "set_user_limits",
        "set limits of a user, a JSON object: max-connections, max-channels",
        limits.set_user_limits,
        ("user", "definition"),
    ),
    Verb(
        "clear_user_limits",
        "remove a limit of a user (all: every one)",
        limits.clear_user_limits,
        ("user", "name"),
    ),
    Verb(
        "list_user_limits",
        "list the users' limits (--user: one user's)",
        limits.list_user_limits,
        (),
        limits.list_user_limits_options,
    ),
    # Queues.
    Verb("list_queues", "list the queues of a vhost", entities.list_queues, ("columns...",)),
    Verb(
        "create_queue",
        "declare a queue",
        entities.create_queue,
        ("name",),
        _create_queue_options,
    ),
    Verb("purge_queue", "remove a queue's ready messages", entities.purge_queue, ("name",)),
    Verb(
        "delete_queue",
        "delete a queue and its messages",
        entities.delete_queue,
        ("name",),
        _delete_queue_options,
    ),
    # Exchanges.
    Verb(
        "list_exchanges", "list the exchanges of a vhost", entities.list_exchanges, ("columns...",)
    ),
    Verb(
        "create_exchange",
        "declare an exchange of TYPE (direct, fanout, topic, headers, x-consistent-hash...)",
        entities.create_exchange,
        ("type", "name"),
        _create_exchange_options,
    ),
    Verb(
        "delete_exchange",
        "delete an exchange",
        entities.delete_exchange,
        ("name",),
        _delete_exchange_options,
    ),
    # Policies.
    Verb("list_policies", "list the policies of a vhost", entities.list_policies),
    Verb(
        "set_policy",
        'set a policy: DEFINITION is JSON, e.g. \'{"max-age": "7D"}\'',
        entities.set_policy,
        ("name", "pattern", "definition"),
        _set_policy_options,
    ),
    Verb("clear_policy", "remove a policy", entities.clear_policy, ("name",)),
    # Connections.
    Verb(
        "list_connections",
        "list client connections (of the vhost given with -p, else all)",
        node.list_connections,
        ("columns...",),
    ),
    Verb(
        "close_connection",
        "close a connection by name",
        node.close_connection,
        ("name", "reason?"),
    ),
    Verb(
        "close_all_connections",
        "close every connection (of the vhost given with -p, else all)",
        node.close_all_connections,
        ("reason?",),
    ),
    # Definitions.
    Verb(
        "export_definitions",
        "print or save the broker's definitions (of the vhost given with -p, else all)",
        node.export_definitions,
        ("file?",),
    ),
    Verb(
        "import_definitions",
        "load definitions from FILE (- for stdin)",
        node.import_definitions,
        ("file",),
    ),
    # Shovels and federation.
    Verb(
        "add_shovel",
        "add or replace a shovel: --src-uri, --src-queue or --src-exchange, --dest-uri, ...",
        links.add_shovel,
        ("name",),
        links.shovel_options,
    ),
    Verb(
        "list_shovels",
        "list shovels and their state (of the vhost given with -p, else all)",
        links.list_shovels,
    ),
    Verb("delete_shovel", "delete a shovel", links.delete_shovel, ("name",)),
    Verb("restart_shovel", "reconnect a shovel now", links.restart_shovel, ("name",)),
    Verb("pause_shovel", "stop a shovel moving messages", links.pause_shovel, ("name",)),
    Verb("resume_shovel", "resume a paused shovel", links.resume_shovel, ("name",)),
    Verb(
        "add_federation_upstream",
        "add or replace a federation upstream: --upstream-uri, --exchange or --queue, ...",
        links.add_federation_upstream,
        ("name",),
        links.upstream_options,
    ),
    Verb(
        "list_federation_upstreams",
        "list the federation upstreams of a vhost",
        links.list_federation_upstreams,
    ),
    Verb(
        "delete_federation_upstream",
        "delete a federation upstream",
        links.delete_federation_upstream,
        ("name",),
    ),
    Verb(
        "list_federation_links",
        "list federation links and their status (of the vhost given with -p, else all)",
        links.list_federation_links,
    ),
    # The node.
    Verb("status", "show the broker's version and totals", node.status),
    Verb(
        "cluster_status",
        "list the cluster's nodes: role, in-sync replica membership and replication lag",
        node.cluster_status,
    ),
    Verb(
        "backup",
        "copy the running broker's data directory into DIR (on the broker's host; empty or "
        "new), consistent and without stopping it",
        backup.backup,
        ("directory",),
        backup.options,
    ),
)
