"""`streamq ctl`: manage a broker, over its HTTP API or, for accounts, its data directory.

Owns the command as a whole: the `ctl` parser (the verbs are `streamq.ctlhttp.commands`)
and the choice between its two modes. Without `--data-dir`, every verb calls a running
broker's management API (`streamq.ctlhttp`), as lavinmqctl does. With `--data-dir DIR`,
the account verbs (users, vhosts, permissions) edit a stopped broker's data directory
instead, which is how the first administrator gets created before the broker ever runs;
the work there is `streamq.broker.accounts`. Output and exit statuses are the same in both
modes (0 done, 1 an error as one line on stderr, 2 bad usage, 69 and 77 from the HTTP
client: see `ctlhttp.client`).

Offline, it first takes the data directory's lock, the same exclusive flock on
`<data_dir>/.lock` that `streamq serve` holds while it runs, and refuses while a broker
holds it. It must not import `streamq.app`, a sibling layer.
"""

from __future__ import annotations

import argparse
import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Final

from streamq.broker.accounts import AccountStore, Permission, TopicPermission
from streamq.broker.backup_files import BackupFailed, BackupRefused, copy_stopped
from streamq.broker.errors import BrokerError
from streamq.ctlhttp import commands, limits
from streamq.ctlhttp.backup import summary
from streamq.ctlhttp.client import EXIT_USAGE, CtlError, JsonValue
from streamq.ctlhttp.output import Done, Result, Row, Table, Value, render

LOCK_FILE: Final = ".lock"  # the file `streamq.app.lock_data_dir` locks: keep them in step
LOCK_PID_BYTES_MAX: Final = 32
PERMISSION_COLUMNS: Final = ("configure", "write", "read")
TOPIC_PERMISSION_COLUMNS: Final = ("exchange", "write", "read")
OFFLINE_HINT: Final = "(if the broker is stopped, give --data-dir to edit its accounts)"
BACKUP_OFFLINE_HINT: Final = (
    "(if the broker is stopped, give --data-dir DATA to copy its data directory)"
)

OfflineHandler = Callable[[AccountStore, argparse.Namespace], Result]


def add_parser(subcommands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `streamq ctl` and its verbs on the top-level parser."""
    ctl = subcommands.add_parser(
        "ctl",
        help="manage a running broker over its HTTP API (or accounts offline: --data-dir)",
        description="Manage a running broker through its management API (--uri). With "
        "--data-dir, the user, vhost and permission verbs edit a stopped broker's data "
        "directory instead.",
        epilog="exit status: 0 done; 1 refused by the broker (400, 404...) or a local error; "
        "2 bad usage; 69 no broker answers at --uri; 77 login failed or not allowed (401, "
        "403). See docs/ctl.md.",
    )
    commands.add_global_flags(ctl, on_verb=False)
    verbs = ctl.add_subparsers(dest="ctl_command", metavar="VERB", required=True)
    commands.add_verbs(verbs)


def main(args: argparse.Namespace) -> int:
    """Run the parsed verb, online or offline; returns the exit status."""
    commands.resolve_vhost(args)
    if args.data_dir is None or args.ctl_command in commands.LOCAL_VERBS:
        offline = args.ctl_command in OFFLINE_VERBS
        hint = OFFLINE_HINT if offline else ""
        if args.ctl_command == "backup":
            hint = BACKUP_OFFLINE_HINT
        return commands.run(args, unavailable_hint=hint)
    try:
        run_offline = _backup_offline if args.ctl_command == "backup" else _run_offline
        result = run_offline(args)
    except CtlError as exc:
        return commands.report(exc)
    except (BrokerError, BackupRefused, BackupFailed, OSError) as exc:
        return commands.report(CtlError(str(exc)))
    return commands.emit(render(result, args.output_format))


def _run_offline(args: argparse.Namespace) -> Result:
    handler = OFFLINE_VERBS.get(args.ctl_command)
    if handler is None:
        raise CtlError(
            f"{args.ctl_command} needs a running broker: leave out --data-dir (which serves "
            "only the user, vhost and permission verbs)",
            EXIT_USAGE,
        )
    if args.uri is not None:
        raise CtlError(
            "give --uri (a running broker) or --data-dir (a stopped one), not both", EXIT_USAGE
        )
    with locked_data_dir(args.data_dir):
        return handler(AccountStore.open(args.data_dir), args)


def _backup_offline(args: argparse.Namespace) -> Result:
    """`backup DIR` of a stopped broker's data directory: copied under its lock."""
    if args.uri is not None:
        raise CtlError(
            "give --uri (a running broker) or --data-dir (a stopped one), not both", EXIT_USAGE
        )
    if not os.path.isdir(args.data_dir):
        raise CtlError(f"{args.data_dir} is not a data directory")
    with locked_data_dir(args.data_dir):
        source, target = os.path.abspath(args.data_dir), os.path.abspath(args.directory)
        manifest = copy_stopped(source, target, links=not args.copy)
    report: dict[str, JsonValue] = dict(manifest)
    return Value(report, summary(report))


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
                f"{data_dir}; stop it first, or leave out --data-dir to manage it over HTTP"
            ) from None
        # As the broker does, so that a broker started meanwhile names who holds the lock.
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the flock


# Users. The store's mutators fsync before returning: a change is durable when ctl exits.


def _add_user(store: AccountStore, args: argparse.Namespace) -> Result:
    store.add_user(args.name, args.password)
    return Done(f'Added user "{args.name}".')


def _delete_user(store: AccountStore, args: argparse.Namespace) -> Result:
    store.delete_user(args.name)
    return Done(f'Deleted user "{args.name}".')


def _change_password(store: AccountStore, args: argparse.Namespace) -> Result:
    store.change_password(args.name, args.password)
    return Done(f'Changed the password of user "{args.name}".')


def _clear_password(store: AccountStore, args: argparse.Namespace) -> Result:
    store.clear_password(args.name)
    return Done(f'Cleared the password of user "{args.name}".')


def _set_user_tags(store: AccountStore, args: argparse.Namespace) -> Result:
    store.set_user_tags(args.name, args.tags)
    return Done(f'Set the tags of user "{args.name}".')


def _list_users(store: AccountStore, args: argparse.Namespace) -> Result:
    rows: list[Row] = [{"user": user.name, "tags": list(user.tags)} for user in store.list_users()]
    return Table(("user", "tags"), rows)


def _authenticate_user(store: AccountStore, args: argparse.Namespace) -> Result:
    if store.authenticate(args.name, args.password) is None:
        raise CtlError(f'user "{args.name}" failed to authenticate')
    return Done(f'User "{args.name}" authenticated.')


# Vhosts.


def _add_vhost(store: AccountStore, args: argparse.Namespace) -> Result:
    store.add_vhost(args.name)
    return Done(f'Added vhost "{args.name}".')


def _delete_vhost(store: AccountStore, args: argparse.Namespace) -> Result:
    store.delete_vhost(args.name)
    return Done(f'Deleted vhost "{args.name}".')


def _list_vhosts(store: AccountStore, args: argparse.Namespace) -> Result:
    return Table(("name",), [{"name": name} for name in store.list_vhosts()])


# Permissions.


def _set_permissions(store: AccountStore, args: argparse.Namespace) -> Result:
    store.set_permissions(args.user, args.vhost, args.configure, args.write, args.read)
    return Done(f'Set the permissions of user "{args.user}" in vhost "{args.vhost}".')


def _clear_permissions(store: AccountStore, args: argparse.Namespace) -> Result:
    store.clear_permissions(args.user, args.vhost)
    return Done(f'Cleared the permissions of user "{args.user}" in vhost "{args.vhost}".')


def _list_permissions(store: AccountStore, args: argparse.Namespace) -> Result:
    rows = [_permission_row("user", p) for p in store.list_permissions(vhost=args.vhost)]
    return Table(("user", *PERMISSION_COLUMNS), rows)


def _list_user_permissions(store: AccountStore, args: argparse.Namespace) -> Result:
    rows = [_permission_row("vhost", p) for p in store.list_permissions(user=args.user)]
    return Table(("vhost", *PERMISSION_COLUMNS), rows)


def _permission_row(key: str, permission: Permission) -> Row:
    name = permission.user if key == "user" else permission.vhost
    return {
        key: name,
        "configure": permission.configure,
        "write": permission.write,
        "read": permission.read,
    }


# Topic permissions.


def _set_topic_permissions(store: AccountStore, args: argparse.Namespace) -> Result:
    store.set_topic_permissions(args.user, args.vhost, args.exchange, args.write, args.read)
    return Done(
        f'Set the topic permissions of user "{args.user}" on exchange "{args.exchange}" '
        f'in vhost "{args.vhost}".'
    )


def _clear_topic_permissions(store: AccountStore, args: argparse.Namespace) -> Result:
    store.clear_topic_permissions(args.user, args.vhost, args.exchange)
    on = f' on exchange "{args.exchange}"' if args.exchange is not None else ""
    return Done(f'Cleared the topic permissions of user "{args.user}"{on} in vhost "{args.vhost}".')


def _list_topic_permissions(store: AccountStore, args: argparse.Namespace) -> Result:
    found = store.list_topic_permissions(vhost=args.vhost)
    return Table(("user", *TOPIC_PERMISSION_COLUMNS), [_topic_row("user", t) for t in found])


def _list_user_topic_permissions(store: AccountStore, args: argparse.Namespace) -> Result:
    found = store.list_topic_permissions(user=args.user)
    return Table(("vhost", *TOPIC_PERMISSION_COLUMNS), [_topic_row("vhost", t) for t in found])


def _topic_row(key: str, topic: TopicPermission) -> Row:
    name = topic.user if key == "user" else topic.vhost
    return {key: name, "exchange": topic.exchange, "write": topic.write, "read": topic.read}


# Limits.


def _set_vhost_limits(store: AccountStore, args: argparse.Namespace) -> Result:
    store.set_vhost_limits(args.vhost, limits.parse_definition(args.definition))
    return Done(f'Set the limits of vhost "{args.vhost}".')


def _clear_vhost_limits(store: AccountStore, args: argparse.Namespace) -> Result:
    store.set_vhost_limits(args.vhost, None)
    return Done(f'Cleared the limits of vhost "{args.vhost}".')


def _list_vhost_limits(store: AccountStore, args: argparse.Namespace) -> Result:
    rows = [limits.vhost_limits_row(v, dict(found)) for v, found in store.list_vhost_limits()]
    if not args.global_:
        rows = [row for row in rows if row["vhost"] == args.vhost]
    return Table(("vhost", "limits"), rows)


def _set_user_limits(store: AccountStore, args: argparse.Namespace) -> Result:
    store.set_user_limits(args.user, limits.parse_definition(args.definition))
    return Done(f'Set the limits of user "{args.user}".')


def _clear_user_limits(store: AccountStore, args: argparse.Namespace) -> Result:
    store.clear_user_limit(args.user, args.name)
    return Done(f'Cleared the limit "{args.name}" of user "{args.user}".')


def _list_user_limits(store: AccountStore, args: argparse.Namespace) -> Result:
    found = store.list_user_limits()
    rows = [limits.user_limits_row(u, dict(v)) for u, v in found if args.user in (None, u)]
    return Table(("user", "limits"), rows)


# The verbs that work offline, with --data-dir; the others need a running broker.
OFFLINE_VERBS: Final[dict[str, OfflineHandler]] = {
    "add_user": _add_user,
    "delete_user": _delete_user,
    "list_users": _list_users,
    "change_password": _change_password,
    "clear_password": _clear_password,
    "set_user_tags": _set_user_tags,
    "authenticate_user": _authenticate_user,
    "add_vhost": _add_vhost,
    "delete_vhost": _delete_vhost,
    "list_vhosts": _list_vhosts,
    "set_permissions": _set_permissions,
    "clear_permissions": _clear_permissions,
    "list_permissions": _list_permissions,
    "list_user_permissions": _list_user_permissions,
    "set_topic_permissions": _set_topic_permissions,
    "clear_topic_permissions": _clear_topic_permissions,
    "list_topic_permissions": _list_topic_permissions,
    "list_user_topic_permissions": _list_user_topic_permissions,
    "set_vhost_limits": _set_vhost_limits,
    "clear_vhost_limits": _clear_vhost_limits,
    "list_vhost_limits": _list_vhost_limits,
    "set_user_limits": _set_user_limits,
    "clear_user_limits": _clear_user_limits,
    "list_user_limits": _list_user_limits,
}
