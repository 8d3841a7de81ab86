"""The account store: users, vhosts and permissions, their checks and their file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from streamq.broker.accounts import (
    ACCOUNTS_DIR,
    ACCOUNTS_FILE,
    NAME_BYTES_MAX,
    AccountsCorrupted,
    AccountStore,
    AccountValueInvalid,
    Permission,
    UserExists,
    UserNotFound,
    VHostExists,
    VHostNotFound,
)
from streamq.broker.errors import BrokerError
from streamq.broker.users import check_password, hash_password, login_allowed

# From RabbitMQ's passwords guide: salt 908DC60A and password "test12".
RABBITMQ_TEST12_HASH = "kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR"


@pytest.fixture
def store(tmp_path: Path) -> AccountStore:
    return AccountStore.open(str(tmp_path))


def accounts_path(data_dir: Path) -> Path:
    return data_dir / ACCOUNTS_DIR / ACCOUNTS_FILE


def reopen(store: AccountStore) -> AccountStore:
    return AccountStore.open(os.path.dirname(os.path.dirname(store.path)))


# First start.


def test_first_start_holds_guest_with_full_permissions_on_default_vhost(
    store: AccountStore,
) -> None:
    assert [user.name for user in store.list_users()] == ["guest"]
    assert store.list_users()[0].tags == ("administrator",)
    assert store.list_vhosts() == ["/"]
    assert store.list_permissions() == [Permission("guest", "/", ".*", ".*", ".*")]
    assert store.authenticate("guest", "guest") is not None
    assert store.vhost_access("guest", "/")


def test_opening_writes_nothing(tmp_path: Path) -> None:
    AccountStore.open(str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_guest_logs_in_only_from_loopback() -> None:
    assert login_allowed("guest", peer_is_loopback=True)
    assert not login_allowed("guest", peer_is_loopback=False)
    assert login_allowed("bob", peer_is_loopback=False)


# Users.


def test_add_user_authenticates_only_with_its_password(store: AccountStore) -> None:
    user = store.add_user("bob", "secret", ["monitoring"])
    assert user.tags == ("monitoring",)
    assert store.authenticate("bob", "secret") == user
    assert store.authenticate("bob", "wrong") is None
    assert store.authenticate("nobody", "secret") is None
    assert not store.vhost_access("bob", "/")  # a new user has no permissions


def test_add_existing_user_is_refused(store: AccountStore) -> None:
    with pytest.raises(UserExists, match="user 'guest' already exists") as caught:
        store.add_user("guest", "x")
    assert isinstance(caught.value, BrokerError)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "user name must not be empty"),
        ("x" * (NAME_BYTES_MAX + 1), "longer than 255"),
        ("é" * 128, "256 bytes, longer than 255"),
        ("\udcff", "not valid UTF-8"),
    ],
)
def test_bad_user_names_are_refused(store: AccountStore, name: str, message: str) -> None:
    with pytest.raises(AccountValueInvalid, match=message):
        store.add_user(name, "x")
    assert not os.path.exists(store.path)


def test_change_and_clear_password(store: AccountStore) -> None:
    store.add_user("bob", "old")
    store.change_password("bob", "new")
    assert store.authenticate("bob", "old") is None
    assert store.authenticate("bob", "new") is not None
    store.clear_password("bob")
    user = store.user("bob")
    assert user is not None
    assert not user.has_password
    assert store.authenticate("bob", "new") is None
    assert store.authenticate("bob", "") is None


def test_set_user_tags_splits_commas_and_drops_repeats(store: AccountStore) -> None:
    store.set_user_tags("guest", ["monitoring,management", " monitoring ", "custom"])
    user = store.user("guest")
    assert user is not None
    assert user.tags == ("monitoring", "management", "custom")
    store.set_user_tags("guest", [])
    assert reopen(store).user("guest") == store.user("guest")


def test_delete_user_drops_its_permissions(store: AccountStore) -> None:
    store.delete_user("guest")
    assert store.list_users() == []
    assert store.list_permissions() == []
    assert not store.permitted("guest", "/", "read", "q")
    with pytest.raises(UserNotFound, match="no user 'guest'"):
        store.delete_user("guest")


@pytest.mark.parametrize("operation", ["change_password", "clear_password", "set_user_tags"])
def test_changing_an_unknown_user_is_refused(store: AccountStore, operation: str) -> None:
    arguments = {"change_password": ("x",), "clear_password": (), "set_user_tags": ([],)}
    with pytest.raises(UserNotFound, match="no user 'nobody'"):
        getattr(store, operation)("nobody", *arguments[operation])


# Passwords.


def test_password_hash_is_rabbitmq_sha256() -> None:
    assert hash_password("test12", bytes.fromhex("908DC60A")) == RABBITMQ_TEST12_HASH
    assert check_password("test12", RABBITMQ_TEST12_HASH)
    assert not check_password("test13", RABBITMQ_TEST12_HASH)
    assert not check_password("test12", "")
    assert not check_password("test12", "not base64!")


def test_a_user_with_a_rabbitmq_hash_in_the_file_authenticates(tmp_path: Path) -> None:
    store = AccountStore.open(str(tmp_path))
    store.add_user("imported", "placeholder")
    document = json.loads(accounts_path(tmp_path).read_text())
    (imported,) = [user for user in document["users"] if user["name"] == "imported"]
    imported["password_hash"] = RABBITMQ_TEST12_HASH
    accounts_path(tmp_path).write_text(json.dumps(document))
    assert AccountStore.open(str(tmp_path)).authenticate("imported", "test12") is not None


# Vhosts.


def test_add_and_delete_vhost(store: AccountStore) -> None:
    store.add_vhost("dev")
    store.set_permissions("guest", "dev", ".*", ".*", ".*")
    assert store.list_vhosts() == ["/", "dev"]
    with pytest.raises(VHostExists, match="vhost 'dev' already exists"):
        store.add_vhost("dev")
    store.delete_vhost("dev")
    assert store.list_vhosts() == ["/"]
    assert not store.vhost_access("guest", "dev")
    assert store.list_permissions(user="guest") == [Permission("guest", "/", ".*", ".*", ".*")]
    with pytest.raises(VHostNotFound, match="no vhost 'dev'"):
        store.delete_vhost("dev")


def test_bad_vhost_name_is_refused(store: AccountStore) -> None:
    with pytest.raises(AccountValueInvalid, match="vhost name must not be empty"):
        store.add_vhost("")


# Permissions.


def test_permissions_need_a_known_user_and_vhost(store: AccountStore) -> None:
    with pytest.raises(UserNotFound):
        store.set_permissions("nobody", "/", ".*", ".*", ".*")
    with pytest.raises(VHostNotFound):
        store.set_permissions("guest", "nowhere", ".*", ".*", ".*")
    with pytest.raises(VHostNotFound):
        store.list_permissions(vhost="nowhere")
    with pytest.raises(UserNotFound):
        store.list_permissions(user="nobody")


def test_invalid_regex_is_refused_with_its_kind(store: AccountStore) -> None:
    with pytest.raises(AccountValueInvalid, match=r"invalid write regex '\(': missing \)"):
        store.set_permissions("guest", "/", ".*", "(", ".*")
    assert store.permissions("guest", "/") == Permission("guest", "/", ".*", ".*", ".*")


def test_regexes_are_searched_in_the_name_as_rabbitmq_does(store: AccountStore) -> None:
    # RabbitMQ runs re:run(Name, Regex) unanchored: anchors make a regex match exactly.
    store.add_user("bob", "x")
    store.set_permissions("bob", "/", "^bob-.*$", "orders", "^(a|b)$")
    assert store.permitted("bob", "/", "configure", "bob-queue")
    assert not store.permitted("bob", "/", "configure", "alice-bob-queue")
    assert store.permitted("bob", "/", "write", "orders")
    assert store.permitted("bob", "/", "write", "old-orders-2")
    assert store.permitted("bob", "/", "read", "a")
    assert not store.permitted("bob", "/", "read", "ab")


def test_empty_regex_matches_nothing(store: AccountStore) -> None:
    store.set_permissions("guest", "/", "", ".*", "")
    assert not store.permitted("guest", "/", "configure", "q")
    assert not store.permitted("guest", "/", "configure", "")
    assert not store.permitted("guest", "/", "read", "")
    assert store.permitted("guest", "/", "write", "q")
    assert store.vhost_access("guest", "/")  # an entry, even of nothing, opens the vhost


def test_default_exchange_is_checked_as_amq_default(store: AccountStore) -> None:
    store.set_permissions("guest", "/", "", "^amq\\.default$", "")
    assert store.permitted("guest", "/", "write", "")
    assert not store.permitted("guest", "/", "write", "amq.direct")
    store.set_permissions("guest", "/", "", "^$", "")
    assert not store.permitted("guest", "/", "write", "")


def test_clear_permissions_closes_the_vhost(store: AccountStore) -> None:
    store.clear_permissions("guest", "/")
    assert not store.vhost_access("guest", "/")
    assert not store.permitted("guest", "/", "read", "q")
    store.clear_permissions("guest", "/")  # nothing left to clear
    assert reopen(store).list_permissions() == []


def test_list_permissions_by_vhost_and_by_user(store: AccountStore) -> None:
    store.add_user("bob", "x")
    store.add_vhost("dev")
    store.set_permissions("bob", "dev", "c", "w", "r")
    store.set_permissions("guest", "dev", "", "", "")
    assert [p.user for p in store.list_permissions(vhost="dev")] == ["bob", "guest"]
    assert [p.vhost for p in store.list_permissions(user="guest")] == ["/", "dev"]
    assert store.list_permissions(user="bob", vhost="/") == []


# Persistence.


def test_changes_survive_reopening(store: AccountStore) -> None:
    store.add_user("bob", "secret", ["management"])
    store.add_vhost("dev")
    store.set_permissions("bob", "dev", "^bob", "", ".*")
    store.delete_user("guest")
    again = reopen(store)
    assert again.list_users() == store.list_users()
    assert again.list_vhosts() == ["/", "dev"]
    assert again.list_permissions() == [Permission("bob", "dev", "^bob", "", ".*")]
    assert again.authenticate("bob", "secret") is not None
    assert again.permitted("bob", "dev", "configure", "bob-1")


def test_file_is_replaced_whole_and_leaves_no_temp_files(tmp_path: Path) -> None:
    store = AccountStore.open(str(tmp_path))
    for index in range(5):
        store.add_vhost(f"v{index}")
    assert sorted(os.listdir(tmp_path / ACCOUNTS_DIR)) == [ACCOUNTS_FILE]
    document = json.loads(accounts_path(tmp_path).read_text())
    assert document["version"] == 1
    assert [vhost["name"] for vhost in document["vhosts"]] == ["/", "v0", "v1", "v2", "v3", "v4"]
    assert document["users"][0]["hashing_algorithm"] == "rabbit_password_hashing_sha256"


def test_a_failed_write_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = AccountStore.open(str(tmp_path))

    def disk_full(path: str, data: bytes, *, fsync_dir: bool) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("streamq.broker.accounts.write_file_atomic", disk_full)
    with pytest.raises(OSError, match="No space left"):
        store.add_user("bob", "x")
    assert store.user("bob") is None


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"{not json", "Expecting property name"),
        (b"[]", "not a JSON object"),
        (b'{"version": 3, "users": [], "vhosts": [], "permissions": []}', "version 3, this"),
        (b'{"version": true, "users": [], "vhosts": [], "permissions": []}', "version True"),
        (b'{"version": 1, "users": {}, "vhosts": [], "permissions": []}', "'users' is not a list"),
        (
            b'{"version": 1, "users": [], "vhosts": [{"name": "/"}], "permissions": '
            b'[{"user": "ghost", "vhost": "/", "configure": "", "write": "", "read": ""}]}',
            "unknown user 'ghost'",
        ),
        (
            b'{"version": 1, "users": [], "vhosts": [{"name": "/"}, {"name": "/"}], '
            b'"permissions": []}',
            "listed twice",
        ),
        (b'{"version": "\xff"}', "can't decode"),
    ],
)
def test_corrupt_file_raises_and_is_kept(tmp_path: Path, content: bytes, reason: str) -> None:
    path = accounts_path(tmp_path)
    path.parent.mkdir()
    path.write_bytes(content)
    with pytest.raises(AccountsCorrupted, match=reason) as caught:
        AccountStore.open(str(tmp_path))
    assert str(path) in str(caught.value)
    assert isinstance(caught.value, BrokerError)
    assert path.read_bytes() == content


def test_bad_regex_or_hash_in_the_file_is_corruption(tmp_path: Path) -> None:
    store = AccountStore.open(str(tmp_path))
    store.add_user("bob", "x")
    document = json.loads(accounts_path(tmp_path).read_text())
    document["permissions"][0]["read"] = "(["
    accounts_path(tmp_path).write_text(json.dumps(document))
    with pytest.raises(AccountsCorrupted, match="invalid read regex"):
        AccountStore.open(str(tmp_path))
    document["permissions"][0]["read"] = ".*"
    document["users"][0]["password_hash"] = "abc"  # bob sorts before guest
    accounts_path(tmp_path).write_text(json.dumps(document))
    with pytest.raises(AccountsCorrupted, match="user 'bob': malformed password_hash"):
        AccountStore.open(str(tmp_path))
