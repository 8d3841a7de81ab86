"""AccountStore.open with a first user (default_user / default_password_hash): a fresh data
directory starts with that user instead of guest, written at once; an existing accounts
file is left as it is."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from streamq.broker.accounts import AccountStore, AccountValueInvalid, FirstUser
from streamq.broker.users import hash_password

ADMIN = FirstUser("admin", hash_password("s3cret"))


def test_a_fresh_directory_starts_with_the_first_user_and_writes_it(tmp_path: Path) -> None:
    store = AccountStore.open(str(tmp_path), ADMIN)
    assert os.path.exists(store.path)
    for again in (store, AccountStore.open(str(tmp_path))):  # reopened without it
        user = again.authenticate("admin", "s3cret")
        assert user is not None and user.tags == ("administrator",)
        assert again.user("guest") is None
        assert again.list_vhosts() == ["/"]
        assert again.permitted("admin", "/", "configure", "any")


def test_an_existing_directory_keeps_its_users(tmp_path: Path) -> None:
    AccountStore.open(str(tmp_path)).add_user("someone", "pw")
    store = AccountStore.open(str(tmp_path), ADMIN)
    assert store.user("admin") is None
    assert store.authenticate("guest", "guest") is not None


def test_without_a_first_user_nothing_is_written(tmp_path: Path) -> None:
    store = AccountStore.open(str(tmp_path))
    assert store.authenticate("guest", "guest") is not None
    assert not os.path.exists(store.path)


def test_a_first_user_needs_a_name_and_a_hash() -> None:
    with pytest.raises(AccountValueInvalid, match="first user needs a password hash"):
        FirstUser("admin", "")
    with pytest.raises(AccountValueInvalid, match="not a rabbit_password_hashing_sha256"):
        FirstUser("admin", "plain")
    with pytest.raises(AccountValueInvalid):
        FirstUser("", hash_password("x"))
