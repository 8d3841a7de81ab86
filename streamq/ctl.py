"""`streamq ctl`: manage users, vhosts and permissions in a stopped broker's data directory.

Owns the command's surface, modelled on rabbitmqctl: subcommands, their output (tab-separated
tables with a header line, or JSON with `--json`) and exit statuses (0 done, 1 an error as
one line on stderr, 2 bad usage from argparse). The work is `streamq.broker.accounts`.

It edits the files of the data directory directly, so it first takes the directory's lock,
the same exclusive flock on `<data_dir>/.lock` that `streamq serve` holds while it runs, and
refuses while a broker holds it. It must not import `streamq.app`, a sibling layer.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Final

from streamq import policyctl
from streamq.broker.accounts import DEFAULT_VHOST, AccountStore, Permission
from streamq.broker.errors import BrokerError

DEFAULT_DATA_DIR: Final = "./data"
LOCK_FILE: Final = ".lock"  # the file `streamq.app.lock_data_dir` locks: keep them in step
LOCK_PID_BYTES_MAX: Final = 32
EXIT_ERROR: Final = 1

Handler = Callable[[AccountStore, argparse.Namespace], None]
Row = dict[str, str | list[str]]
PERMISSION_COLUMNS: Final = ("configure", "write", "read")


@dataclass(frozen=True, slots=True)
class _Command:
    name: str
    help: str
    handler: Handler
    positionals: tuple[str, ...] = ()  # "X..." takes any number
    vhost: bool = False  # takes -p VHOST
    json: bool = False  # a listing: takes --json


class CtlError(Exception):
    """An error reported as one line on stderr with exit status 1."""


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `streamq ctl` and its subcommands on the top-level parser."""
    ctl = commands.add_parser(
        "ctl",
        help="manage users, vhosts and permissions of a stopped broker",
        description="Edit the users, vhosts and permissions in a data directory. The broker "
        "must be stopped: online management comes with the HTTP API.",
    )
    ctl.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help="data directory (./data)")
    subcommands = ctl.add_subparsers(dest="ctl_command", metavar="SUBCOMMAND", required=True)
    for command in _COMMANDS:
        _add_subcommand(subcommands, command)
    policyctl.add_subcommands(subcommands)


def _add_subcommand(
    subcommands: argparse._SubParsersAction[argparse.ArgumentParser], command: _Command
) -> None:
    sub = subcommands.add_parser(command.name, help=command.help, description=command.help)
    # SUPPRESS keeps the ctl-level --data-dir unless the flag is given after the subcommand.
    sub.add_argument("--data-dir", default=argparse.SUPPRESS, help="data directory (./data)")
    if command.vhost:
        sub.add_argument("-p", "--vhost", default=DEFAULT_VHOST, help="vhost (/)")
    if command.json:
        sub.add_argument("--json", action="store_true", help="print JSON, not a table")
    for positional in command.positionals:
        many = positional.endswith("...")
        sub.add_argument(positional.removesuffix("..."), nargs="*" if many else None)
    sub.set_defaults(ctl_handler=command.handler)


def main(args: argparse.Namespace) -> int:
    """Run the parsed subcommand; returns the exit status."""
    if getattr(args, "ctl_online", None):
        return policyctl.main(args)  # talks to a running broker: no data directory lock
    handler: Handler = args.ctl_handler
    data_dir: str = args.data_dir
    try:
        with locked_data_dir(data_dir):
            handler(AccountStore.open(data_dir), args)
    except (CtlError, BrokerError, OSError) as exc:
        message = " ".join(str(exc).split())
        print(f"streamq ctl: {message}", file=sys.stderr)
        return EXIT_ERROR
    return 0


@contextmanager
def locked_data_dir(data_dir: str) -> Iterator[None]:
    """Hold the data directory's lock (creating the directory if needed) for the block.

    Raises CtlError while another process, normally the broker, holds it; OSError if the
    directory or lock file cannot be created.
    """
    os.makedirs(data_dir, exist_ok=True)
    fd = os.open(os.path.join(data_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = os.pread(fd, LOCK_PID_BYTES_MAX, 0).decode(errors="replace").strip()
            raise CtlError(
                f"the broker (pid {pid or 'unknown'}) is running on data directory "
                f"{data_dir}; stop it first (online management comes with the HTTP API)"
            ) from None
        # As the broker does, so that a broker started meanwhile names who holds the lock.
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the flock


# Users.


def _add_user(store: AccountStore, args: argparse.Namespace) -> None:
    store.add_user(args.NAME, args.PASSWORD)
    print(f'Added user "{args.NAME}".')


def _delete_user(store: AccountStore, args: argparse.Namespace) -> None:
    store.delete_user(args.NAME)
    print(f'Deleted user "{args.NAME}".')


def _change_password(store: AccountStore, args: argparse.Namespace) -> None:
    store.change_password(args.NAME, args.PASSWORD)
    print(f'Changed the password of user "{args.NAME}".')


def _clear_password(store: AccountStore, args: argparse.Namespace) -> None:
    store.clear_password(args.NAME)
    print(f'Cleared the password of user "{args.NAME}".')


def _set_user_tags(store: AccountStore, args: argparse.Namespace) -> None:
    store.set_user_tags(args.NAME, args.TAG)
    print(f'Set the tags of user "{args.NAME}".')


def _list_users(store: AccountStore, args: argparse.Namespace) -> None:
    rows: list[Row] = [{"user": user.name, "tags": list(user.tags)} for user in store.list_users()]
    _print_rows(("user", "tags"), rows, as_json=args.json)


def _authenticate_user(store: AccountStore, args: argparse.Namespace) -> None:
    if store.authenticate(args.NAME, args.PASSWORD) is None:
        raise CtlError(f'user "{args.NAME}" failed to authenticate')
    print(f'User "{args.NAME}" authenticated.')


# Vhosts.


def _add_vhost(store: AccountStore, args: argparse.Namespace) -> None:
    store.add_vhost(args.NAME)
    print(f'Added vhost "{args.NAME}".')


def _delete_vhost(store: AccountStore, args: argparse.Namespace) -> None:
    store.delete_vhost(args.NAME)
    print(f'Deleted vhost "{args.NAME}".')


def _list_vhosts(store: AccountStore, args: argparse.Namespace) -> None:
    rows: list[Row] = [{"name": name} for name in store.list_vhosts()]
    _print_rows(("name",), rows, as_json=args.json)


# Permissions.


def _set_permissions(store: AccountStore, args: argparse.Namespace) -> None:
    store.set_permissions(args.USER, args.vhost, args.CONF, args.WRITE, args.READ)
    print(f'Set the permissions of user "{args.USER}" in vhost "{args.vhost}".')


def _clear_permissions(store: AccountStore, args: argparse.Namespace) -> None:
    store.clear_permissions(args.USER, args.vhost)
    print(f'Cleared the permissions of user "{args.USER}" in vhost "{args.vhost}".')


def _list_permissions(store: AccountStore, args: argparse.Namespace) -> None:
    rows = [_permission_row("user", p) for p in store.list_permissions(vhost=args.vhost)]
    _print_rows(("user", *PERMISSION_COLUMNS), rows, as_json=args.json)


def _list_user_permissions(store: AccountStore, args: argparse.Namespace) -> None:
    rows = [_permission_row("vhost", p) for p in store.list_permissions(user=args.USER)]
    _print_rows(("vhost", *PERMISSION_COLUMNS), rows, as_json=args.json)


def _permission_row(key: str, permission: Permission) -> Row:
    name = permission.user if key == "user" else permission.vhost
    return {
        key: name,
        "configure": permission.configure,
        "write": permission.write,
        "read": permission.read,
    }


def _print_rows(columns: Sequence[str], rows: list[Row], *, as_json: bool) -> None:
    """Print `rows` as rabbitmqctl does: a header line then tab-separated values; lists as
    `[a, b]`. With `as_json`, one JSON array of objects."""
    if as_json:
        print(json.dumps(rows, ensure_ascii=False))
        return
    print("\t".join(columns))
    for row in rows:
        print("\t".join(_cell(row[column]) for column in columns))


def _cell(value: str | list[str]) -> str:
    return value if isinstance(value, str) else f"[{', '.join(value)}]"


_COMMANDS: Final = (
    _Command("add_user", "add a user (with no permissions)", _add_user, ("NAME", "PASSWORD")),
    _Command("delete_user", "delete a user and its permissions", _delete_user, ("NAME",)),
    _Command("change_password", "change a password", _change_password, ("NAME", "PASSWORD")),
    _Command("clear_password", "clear a password: logins fail", _clear_password, ("NAME",)),
    _Command("set_user_tags", "replace a user's tags", _set_user_tags, ("NAME", "TAG...")),
    _Command("list_users", "list users and their tags", _list_users, json=True),
    _Command("authenticate_user", "check a password", _authenticate_user, ("NAME", "PASSWORD")),
    _Command("add_vhost", "add a vhost", _add_vhost, ("NAME",)),
    _Command("delete_vhost", "delete a vhost and its permissions", _delete_vhost, ("NAME",)),
    _Command("list_vhosts", "list vhosts", _list_vhosts, json=True),
    _Command(
        "set_permissions",
        "set a user's configure, write and read regexes in a vhost",
        _set_permissions,
        ("USER", "CONF", "WRITE", "READ"),
        vhost=True,
    ),
    _Command(
        "clear_permissions",
        "remove a user's permissions in a vhost",
        _clear_permissions,
        ("USER",),
        vhost=True,
    ),
    _Command(
        "list_permissions", "list permissions in a vhost", _list_permissions, vhost=True, json=True
    ),
    _Command(
        "list_user_permissions",
        "list a user's permissions",
        _list_user_permissions,
        ("USER",),
        json=True,
    ),
)
