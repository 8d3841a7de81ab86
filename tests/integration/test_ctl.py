"""`streamq ctl --data-dir` as an operator runs it: a real process editing the accounts of a
stopped broker's data directory under tmp_path (the HTTP verbs are test_ctl_http.py)."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

CTL_TIMEOUT_S = 30


def ctl(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streamq", "ctl", *args, "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=CTL_TIMEOUT_S,
        check=False,
    )


def ok(data_dir: Path, *args: str) -> str:
    done = ctl(data_dir, *args)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    return done.stdout


def fails(data_dir: Path, *args: str) -> str:
    """The one-line error of a command that exits 1."""
    done = ctl(data_dir, *args)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("streamq ctl: ")
    assert "Traceback" not in done.stderr
    return done.stderr.strip()


@contextmanager
def locked(data_dir: Path, pid: int) -> Iterator[None]:
    """Hold the data directory's lock as a running broker does, with `pid` in the file."""
    data_dir.mkdir(exist_ok=True)
    fd = os.open(data_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{pid}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


def test_fresh_directory_lists_the_defaults(data_dir: Path) -> None:
    assert ok(data_dir, "list_users") == "user   tags\nguest  [administrator]\n"
    assert ok(data_dir, "list_vhosts") == "name\n/\n"
    assert ok(data_dir, "list_permissions") == (
        "user   configure  write  read\nguest  .*         .*     .*\n"
    )
    assert not (data_dir / "definitions").exists()  # listing writes nothing


def test_users_added_listed_changed_and_deleted(data_dir: Path) -> None:
    ok(data_dir, "add_user", "bob", "secret")
    ok(data_dir, "set_user_tags", "bob", "monitoring", "management")
    assert "bob    [monitoring, management]\n" in ok(data_dir, "list_users")
    users = json.loads(ok(data_dir, "list_users", "--json"))
    assert users == [
        {"user": "bob", "tags": ["monitoring", "management"]},
        {"user": "guest", "tags": ["administrator"]},
    ]
    ok(data_dir, "authenticate_user", "bob", "secret")
    assert fails(data_dir, "authenticate_user", "bob", "wrong") == (
        'streamq ctl: user "bob" failed to authenticate'
    )
    ok(data_dir, "change_password", "bob", "new")
    ok(data_dir, "authenticate_user", "bob", "new")
    ok(data_dir, "clear_password", "bob")
    fails(data_dir, "authenticate_user", "bob", "new")
    ok(data_dir, "delete_user", "bob")
    assert ok(data_dir, "list_users") == "user   tags\nguest  [administrator]\n"


def test_vhosts_and_permissions(data_dir: Path) -> None:
    ok(data_dir, "add_vhost", "dev")
    ok(data_dir, "add_user", "bob", "x")
    ok(data_dir, "set_permissions", "-p", "dev", "bob", "^bob-.*", "", ".*")
    assert ok(data_dir, "list_permissions", "-p", "dev") == (
        'user  configure  write  read\nbob   ^bob-.*    ""     .*\n'
    )
    assert json.loads(ok(data_dir, "list_user_permissions", "bob", "--json")) == [
        {"vhost": "dev", "configure": "^bob-.*", "write": "", "read": ".*"}
    ]
    assert ok(data_dir, "list_vhosts", "--json") == '[\n{"name": "/"},\n{"name": "dev"}\n]\n'
    ok(data_dir, "clear_permissions", "-p", "dev", "bob")
    assert ok(data_dir, "list_user_permissions", "bob") == "vhost  configure  write  read\n"
    ok(data_dir, "set_permissions", "-p", "dev", "bob", ".*", ".*", ".*")
    ok(data_dir, "delete_vhost", "dev")
    assert ok(data_dir, "list_vhosts") == "name\n/\n"
    assert ok(data_dir, "list_user_permissions", "bob") == "vhost  configure  write  read\n"


def test_data_dir_may_come_before_the_subcommand(data_dir: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "streamq", "ctl", "--data-dir", str(data_dir), "add_vhost", "v"],
        capture_output=True,
        text=True,
        timeout=CTL_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "v\n" in ok(data_dir, "list_vhosts")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("add_user", "guest", "x"), "user 'guest' already exists"),
        (("delete_user", "nobody"), "no user 'nobody'"),
        (("add_user", "", "x"), "user name must not be empty"),
        (("add_vhost", "/"), "vhost '/' already exists"),
        (("delete_vhost", "nowhere"), "no vhost 'nowhere'"),
        (("set_permissions", "-p", "nowhere", "guest", "", "", ""), "no vhost 'nowhere'"),
        (("set_permissions", "guest", "(", ".*", ".*"), "invalid configure regex '('"),
        (("list_permissions", "-p", "nowhere"), "no vhost 'nowhere'"),
        (("list_user_permissions", "nobody"), "no user 'nobody'"),
    ],
)
def test_errors_are_one_line_and_exit_1(
    data_dir: Path, args: tuple[str, ...], message: str
) -> None:
    assert message in fails(data_dir, *args)


def test_corrupt_accounts_file_is_reported_and_kept(data_dir: Path) -> None:
    path = data_dir / "definitions" / "accounts.json"
    path.parent.mkdir(parents=True)
    path.write_text("{oops")
    error = fails(data_dir, "add_user", "bob", "x")
    assert str(path) in error
    assert "unreadable" in error
    assert path.read_text() == "{oops"


@pytest.mark.parametrize(
    "args",
    [
        (),
        ("no_such_command",),
        ("add_user", "bob"),
        ("list_users", "extra"),
        ("set_permissions", "guest", ".*"),
    ],
)
def test_bad_arguments_exit_2(data_dir: Path, args: tuple[str, ...]) -> None:
    done = ctl(data_dir, *args)
    assert done.returncode == 2
    assert "usage:" in done.stderr
    assert "Traceback" not in done.stderr


def test_refuses_while_the_broker_holds_the_data_dir(data_dir: Path) -> None:
    with locked(data_dir, pid=4242):
        error = fails(data_dir, "add_user", "bob", "x")
        fails(data_dir, "list_users")
    assert error == (
        f"streamq ctl: the broker (pid 4242) is running on data directory {data_dir}; "
        "stop it first, or leave out --data-dir to manage it over HTTP"
    )
    assert not (data_dir / "definitions").exists()
    ok(data_dir, "add_user", "bob", "x")  # released: ctl works again


def test_ctl_releases_the_lock(data_dir: Path) -> None:
    ok(data_dir, "add_vhost", "v")
    with locked(data_dir, pid=os.getpid()):
        pass  # would raise BlockingIOError if ctl had left the lock held


def test_changes_are_confirmed_on_stdout(data_dir: Path) -> None:
    assert ok(data_dir, "add_user", "bob", "x") == 'Added user "bob".\n'
    assert ok(data_dir, "add_vhost", "dev", "--format", "json") == ""  # JSON: nothing


def test_verbs_without_an_offline_form_refuse_a_data_dir(data_dir: Path) -> None:
    done = ctl(data_dir, "list_queues")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "streamq ctl: list_queues needs a running broker: leave out --data-dir "
        "(which serves only the user, vhost and permission verbs)\n"
    )
    assert not data_dir.exists()  # refused before touching the directory
